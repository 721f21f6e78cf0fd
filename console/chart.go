package console

import (
	"fmt"
	"math"
	"strconv"
)

// chart is a small bar chart drawn on the server as inline SVG (the
// template "chart" renders it): columns of stacked segments, a scale on the
// left, a few labels below. Every number is formatted here, so the template
// only places strings.
type chart struct {
	// Label describes the chart for screen readers (aria-label).
	Label  string
	Width  int
	Height int
	Rects  []chartRect
	Texts  []chartText
	Lines  []chartLine
	Legend []legendItem
	// Empty is true when every value is zero.
	Empty bool
}

type chartRect struct {
	X, Y, W, H string
	// Class picks the fill (console.css); Title is the tooltip.
	Class, Title string
}

type chartText struct {
	X, Y, Anchor, Text string
}

type chartLine struct {
	X1, Y1, X2, Y2 string
}

type legendItem struct {
	Class, Name string
	Total       string
}

// series is one kind of segment of a chart: its name and style class.
type series struct {
	name, class string
}

// column is one bar of a chart: its label (shown for some columns) and
// tooltip, and one value per series; a marked column (a failed pass) is
// drawn full height in the "mark" class behind its values (what the pass
// found before it failed), which count in the legend as any others.
type column struct {
	label, title string
	values       []float64
	mark         bool
}

// Chart geometry, in SVG user units: a chart in a card of its own row is
// wideChartWidth wide, so its text keeps the size of the others'.
const (
	chartWidth     = 640
	wideChartWidth = 1000
	chartHeight    = 150
	chartLeft      = 44
	chartBottom    = 18
	chartTop       = 6
	labelEvery     = 5
	chartBarFill   = 0.8
)

// barChart lays out columns of stacked series, width units wide.
func barChart(label string, width int, ss []series, cols []column) chart {
	c := chart{Label: label, Width: width, Height: chartHeight}
	plotW, plotH := float64(width-chartLeft), float64(chartHeight-chartBottom-chartTop)
	totals := make([]float64, len(ss))
	peak := 0.0
	for _, col := range cols {
		sum := 0.0
		for i, v := range col.values {
			sum += v
			totals[i] += v
		}
		peak = max(peak, sum)
	}
	c.Empty = peak == 0
	scale := niceCeil(peak)
	for i, s := range ss {
		c.Legend = append(c.Legend, legendItem{Class: s.class, Name: s.name, Total: count(int64(math.Round(totals[i])))})
	}
	baseY := float64(chartTop) + plotH
	c.Lines = append(c.Lines, chartLine{X1: num(chartLeft), Y1: num(baseY), X2: num(float64(width)), Y2: num(baseY)})
	c.Lines = append(c.Lines, chartLine{X1: num(chartLeft), Y1: num(chartTop), X2: num(float64(width)), Y2: num(chartTop)})
	c.Texts = append(c.Texts,
		chartText{X: num(chartLeft - 4), Y: num(chartTop + 4), Anchor: anchorEnd, Text: count(int64(scale))},
		chartText{X: num(chartLeft - 4), Y: num(baseY), Anchor: anchorEnd, Text: "0"})
	if len(cols) == 0 {
		return c
	}
	step := plotW / float64(len(cols))
	w := step * chartBarFill
	for i, col := range cols {
		x := chartLeft + float64(i)*step + (step-w)/2
		if col.label != "" && (i%labelEvery == 0 || i == len(cols)-1) {
			t := chartText{X: num(x + w/2), Y: num(chartHeight - 4), Anchor: "middle", Text: col.label}
			if i == len(cols)-1 && len(cols) > 1 { // flush right, inside the frame
				t.X, t.Anchor = num(x+w), anchorEnd
			}
			c.Texts = append(c.Texts, t)
		}
		if col.mark {
			c.Rects = append(c.Rects, chartRect{X: num(x), Y: num(chartTop), W: num(w), H: num(plotH), Class: "mark", Title: col.title})
		}
		y := baseY
		for j, v := range col.values {
			if v <= 0 {
				continue
			}
			h := v / scale * plotH
			y -= h
			c.Rects = append(c.Rects, chartRect{
				X: num(x), Y: num(y), W: num(w), H: num(h), Class: ss[j].class,
				Title: fmt.Sprintf("%s — %s: %s", col.title, ss[j].name, count(int64(math.Round(v)))),
			})
		}
	}
	return c
}

// anchorEnd aligns a text's end on its position (SVG text-anchor).
const anchorEnd = "end"

// stackHeight is the height of a stackBar.
const stackHeight = 24

// stackBar lays out one horizontal bar split in parts, one per series: a
// whole and its shares (keys by state).
func stackBar(label string, ss []series, values []float64) chart {
	c := chart{Label: label, Width: chartWidth, Height: stackHeight}
	total := 0.0
	for i, v := range values {
		total += v
		c.Legend = append(c.Legend, legendItem{Class: ss[i].class, Name: ss[i].name, Total: count(int64(math.Round(v)))})
	}
	c.Empty = total == 0
	if c.Empty {
		c.Rects = append(c.Rects, chartRect{X: "0", Y: "0", W: num(chartWidth), H: num(stackHeight), Class: "empty", Title: "none"})
		return c
	}
	x := 0.0
	for i, v := range values {
		if v <= 0 {
			continue
		}
		w := v / total * chartWidth
		c.Rects = append(c.Rects, chartRect{
			X: num(x), Y: "0", W: num(w), H: num(stackHeight), Class: ss[i].class,
			Title: fmt.Sprintf("%s: %s (%.1f%%)", ss[i].name, count(int64(math.Round(v))), v/total*100),
		})
		x += w
	}
	return c
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (at least 1), the
// top of a chart's scale.
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// num formats a coordinate with at most one decimal.
func num(v float64) string { return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64) }
