package console

import (
	"strconv"
	"strings"
	"time"
)

// count formats n with thousands separators: 1234567 → "1,234,567".
func count(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// span formats a duration in milliseconds for people: "850ms", "42s",
// "3m12s", "5h04m", "2d03h". Negative spans read as their absolute value.
func span(ms int64) string {
	if ms < 0 {
		ms = -ms
	}
	d := time.Duration(ms) * time.Millisecond
	switch {
	case d < time.Second:
		return strconv.FormatInt(ms, 10) + "ms"
	case d < time.Minute:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	case d < time.Hour:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m" + pad2(int64(d%time.Minute/time.Second)) + "s"
	case d < 48*time.Hour:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h" + pad2(int64(d%time.Hour/time.Minute)) + "m"
	}
	return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d" + pad2(int64(d%(24*time.Hour)/time.Hour)) + "h"
}

func pad2(n int64) string {
	if n < 10 {
		return "0" + strconv.FormatInt(n, 10)
	}
	return strconv.FormatInt(n, 10)
}

// relative formats a time ms milliseconds from now: "in 3m12s", "3m12s
// ago", "now".
func relative(ms int64) string {
	switch {
	case ms > 0:
		return "in " + span(ms)
	case ms < 0:
		return span(ms) + " ago"
	}
	return "now"
}

// byteSize formats n bytes: "512 B", "8.0 KiB", "1.2 MiB".
func byteSize(n int) string {
	switch {
	case n < 1<<10:
		return strconv.Itoa(n) + " B"
	case n < 1<<20:
		return strconv.FormatFloat(float64(n)/(1<<10), 'f', 1, 64) + " KiB"
	}
	return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB"
}
