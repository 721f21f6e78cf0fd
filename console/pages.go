package console

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"time"
)

// templateFiles holds the pages: layout.html around one file per page.
//
//go:embed templates/*.html
var templateFiles embed.FS

// stylesheet is the console's one stylesheet.
//
//go:embed static/console.css
var stylesheet []byte

// pageNames are the pages, each templates/<name>.html.
var pageNames = []string{"overview", "keys", "key", "purge", "events", "message"}

// pages are the parsed templates, by page name.
type pages map[string]*template.Template

func parsePages() (pages, error) {
	p := pages{}
	for _, name := range pageNames {
		t, err := template.New(name).ParseFS(templateFiles, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: parse page %s: %w", name, err)
		}
		p[name] = t
	}
	return p, nil
}

// page is what every page's template gets: the layout's fields and the
// page's own Data.
type page struct {
	Title    string
	Nav      string
	Prefix   string
	User     string
	CSRF     string
	ReadOnly bool
	Redact   bool
	Data     any
}

// render writes page name with data and status. The page is rendered
// whole before anything is written, so a template error is a clean 500.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name, title string, data any) {
	user := userOf(r)
	p := page{
		Title: title, Nav: name, Prefix: c.prefix, User: user, CSRF: c.guard.token(user, time.Now()),
		ReadOnly: c.cfg.ReadOnly, Redact: c.cfg.Redact, Data: data,
	}
	var buf bytes.Buffer
	if err := c.pages[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		c.log.Error("console: render page", "page", name, "err", err)
		http.Error(w, "500 internal server error: the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// message is the data of the message page: an error or a note.
type message struct {
	Heading, Text string
}

// fail answers 500 for a page that could not be read or an action that
// failed, with the error (escaped) for the operator, and logs it. A client
// that left gets nothing.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil && errors.Is(err, r.Context().Err()) {
		return
	}
	c.log.Error("console: page failed", "path", r.URL.Path, "err", err)
	c.render(w, r, http.StatusInternalServerError, "message", "Error", message{Heading: "This page could not be read", Text: err.Error()})
}

// notFound answers 404 with text.
func (c *Console) notFound(w http.ResponseWriter, r *http.Request, text string) {
	c.say(w, r, http.StatusNotFound, "Not found", text)
}

// badRequest answers 400 with text.
func (c *Console) badRequest(w http.ResponseWriter, r *http.Request, text string) {
	c.say(w, r, http.StatusBadRequest, "Bad request", text)
}

// say answers status with the message page: heading (its title too) and
// text.
func (c *Console) say(w http.ResponseWriter, r *http.Request, status int, heading, text string) {
	c.render(w, r, status, "message", heading, message{Heading: heading, Text: text})
}

// serveStylesheet serves the stylesheet.
func serveStylesheet(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/css; charset=utf-8")
	w.Header().Set("Cache-Control", "max-age=3600")
	_, _ = w.Write(stylesheet)
}
