package dashboard

import (
	"fmt"
	"html/template"
	"io/fs"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/task"
)

// holderColours is the number of colours of the bucket map; nodes past it
// share colours.
const holderColours = 12

var funcs = template.FuncMap{
	"ts":  absolute,
	"ago": ago,
	"dur": func(d time.Duration) string {
		if d == 0 {
			return "none"
		}
		return d.String()
	},
	"took": took,
	// Data never goes into a path segment as text: paths carry ids alone,
	// and html/template escapes what goes into a query string.
	"failure":  failure,
	"terminal": func(s task.Status) bool { return s.Terminal() },
}

func absolute(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// ago shows t relative to now ("3m ago", "in 20s"), with the absolute time
// on hover and for machines.
func ago(now, t time.Time) template.HTML {
	if t.IsZero() {
		return "—"
	}
	d := now.Sub(t)
	rel := short(d) + " ago"
	if d < 0 {
		rel = "in " + short(-d)
	}
	if d > -time.Second && d < time.Second {
		rel = "now"
	}
	// Both strings are made here from a time: no text of anyone else's.
	return template.HTML(fmt.Sprintf(`<time datetime="%s" title="%s">%s</time>`,
		t.UTC().Format(time.RFC3339Nano), absolute(t), rel))
}

// short is a duration in its largest unit or two: "3m12s", "2h5m", "4d3h".
func short(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		m := int(d.Minutes())
		if s := int(d.Seconds()) - 60*m; s > 0 && m < 10 {
			return fmt.Sprintf("%dm%ds", m, s)
		}
		return fmt.Sprintf("%dm", m)
	case d < 48*time.Hour:
		h := int(d.Hours())
		if m := int(d.Minutes()) - 60*h; m > 0 && h < 10 {
			return fmt.Sprintf("%dh%dm", h, m)
		}
		return fmt.Sprintf("%dh", h)
	}
	days := int(d.Hours() / 24)
	if h := int(d.Hours()) - 24*days; h > 0 && days < 10 {
		return fmt.Sprintf("%dd%dh", days, h)
	}
	return fmt.Sprintf("%dd", days)
}

// took is how long a task's latest attempt ran, or has run so far.
func took(now time.Time, t *task.Task) string {
	switch {
	case t.StartedAt.IsZero():
		return ""
	case t.FinishedAt.IsZero() && t.Status.Active():
		return short(now.Sub(t.StartedAt))
	case !t.FinishedAt.IsZero() && !t.FinishedAt.Before(t.StartedAt):
		return short(t.FinishedAt.Sub(t.StartedAt))
	}
	return ""
}

// failure reports whether an attempt that ended in s failed: the charts
// count these against the successes.
func failure(s task.Status) bool {
	return s == task.Failed || s == task.TimedOut || s == task.Lost || s == task.Retrying
}

func parsePages() (map[string]*template.Template, error) {
	names, err := fs.Glob(templateFiles, "templates/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, f := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(f, "templates/"), ".html")
		if name == "layout" {
			continue
		}
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFiles, "templates/layout.html", f)
		if err != nil {
			return nil, fmt.Errorf("dashboard template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}
