package dashboard

import (
	"bytes"
	"context"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// hub runs one reader per live view, whoever watches it: the first viewer
// of a view (the fleet, task 7, pipeline 3) starts a goroutine that reads
// and renders the view every interval and hands the rendering to every
// viewer; the last one to leave ends it. Ten viewers of a page cost the
// store what one does, and a viewer who arrives gets the latest rendering
// at once.
type hub struct {
	interval, timeout time.Duration
	log               *zap.Logger

	mu     sync.Mutex
	feeds  map[string]*feed
	closed bool
	quit   chan struct{}
	wg     sync.WaitGroup
}

type feed struct {
	read func(context.Context) []byte
	subs map[*viewer]struct{}
	last []byte // the latest rendering; nil before the first
}

// viewer receives a feed's renderings: its channel holds the newest one
// not yet taken, so that a slow viewer skips renderings, never blocks the
// feed.
type viewer struct{ ch chan []byte }

func newHub(interval, timeout time.Duration, log *zap.Logger) *hub {
	return &hub{interval: interval, timeout: timeout, log: log, feeds: map[string]*feed{}, quit: make(chan struct{})}
}

func (v *viewer) offer(b []byte) {
	select {
	case <-v.ch: // drop the rendering the viewer has not taken
	default:
	}
	v.ch <- b // the feed is the channel's only sender
}

// watch joins the feed of key, starting it with read when nobody watches
// it. leave must be called once the viewer is done. ok is false once the
// hub is closed.
func (h *hub) watch(key string, read func(context.Context) []byte) (v *viewer, leave func(), ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, nil, false
	}
	v = &viewer{ch: make(chan []byte, 1)}
	f := h.feeds[key]
	if f == nil {
		f = &feed{read: read, subs: map[*viewer]struct{}{}}
		h.feeds[key] = f
		h.wg.Add(1)
		go h.run(key, f)
	} else if f.last != nil {
		v.offer(f.last)
	}
	f.subs[v] = struct{}{}
	return v, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(f.subs, v)
	}, true
}

func (h *hub) run(key string, f *feed) {
	defer h.wg.Done()
	tick := time.NewTicker(h.interval)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), h.timeout)
		b := f.read(ctx)
		cancel()
		h.mu.Lock()
		if len(f.subs) == 0 || h.closed {
			delete(h.feeds, key)
			h.mu.Unlock()
			return
		}
		f.last = b
		for v := range f.subs {
			v.offer(b)
		}
		h.mu.Unlock()
		select {
		case <-h.quit:
		case <-tick.C:
		}
	}
}

func (h *hub) close() {
	h.mu.Lock()
	if !h.closed {
		h.closed = true
		close(h.quit)
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// sseEvent encodes one server-sent event. The event stream format ends a
// line at CR LF, at a lone LF and at a lone CR alike, and a line of data
// that held one would end the field there: the rest would be read as a
// field of its own (a "retry:" or an "event:") or cut the page. So data is
// split at every line ending the format knows and sent as one "data:" line
// each, which the browser joins again with LF; the event name is ours, and
// loses any line ending anyway.
func sseEvent(event, data string) []byte {
	var b bytes.Buffer
	b.WriteString("event: ")
	b.WriteString(strings.NewReplacer("\r", "", "\n", "").Replace(event))
	b.WriteByte('\n')
	for {
		i := strings.IndexAny(data, "\r\n")
		if i < 0 {
			break
		}
		b.WriteString("data: ")
		b.WriteString(data[:i])
		b.WriteByte('\n')
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	b.WriteString("data: ")
	b.WriteString(data)
	b.WriteString("\n\n")
	return b.Bytes()
}

// liveReader makes the reader of a feed: it reads the view and renders
// each of the page's live parts (templates of the page, each sent as the
// event of its name), or an error in the first one's place. The view must
// not depend on the viewer: every viewer of the feed gets the same bytes.
func (s *Server) liveReader(name string, view func(context.Context) (any, error), parts ...string) func(context.Context) []byte {
	return func(ctx context.Context) []byte {
		data, err := view(ctx)
		var out, buf bytes.Buffer
		for _, part := range parts {
			buf.Reset()
			if err == nil {
				err = s.pages[name].ExecuteTemplate(&buf, part, page{Data: data, Writable: s.cfg.Token != "", Now: s.now()})
			}
			if err != nil {
				buf.Reset()
				fmt.Fprintf(&buf, `<p class="error">%s</p>`, template.HTMLEscapeString(redactSecrets(err.Error())))
				out.Write(sseEvent(parts[0], buf.String()))
				break
			}
			out.Write(sseEvent(part, buf.String()))
		}
		return out.Bytes()
	}
}

// live streams the feed of key as server-sent events for at most LiveFor.
// Under AuthAll a stream ends as soon as its session does: a sign-out
// stops what the signed-out browser still watches.
func (s *Server) live(w http.ResponseWriter, r *http.Request, key string, read func(context.Context) []byte) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming is not supported here", http.StatusInternalServerError)
		return
	}
	v, leave, ok := s.feeds.watch(key, read)
	if !ok {
		http.Error(w, "the dashboard is shutting down", http.StatusServiceUnavailable)
		return
	}
	defer leave()
	var sessionID string
	if s.cfg.Auth == AuthAll {
		if sess := s.session(r); sess != nil {
			sessionID = sess.id
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	flusher.Flush()
	end := time.NewTimer(s.cfg.LiveFor)
	defer end.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-s.closed:
			return
		case <-end.C:
			return
		case b := <-v.ch:
			if sessionID != "" && !s.sessions.alive(sessionID, s.now()) {
				return
			}
			if _, err := w.Write(b); err != nil {
				return
			}
			flusher.Flush()
		}
	}
}
