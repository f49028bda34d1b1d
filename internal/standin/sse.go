package standin

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// events writes a streamed answer as server-sent events, the framing all
// three protocols stream in.
type events struct {
	w http.ResponseWriter
	f http.Flusher
}

// newEvents starts a text/event-stream answer.
func newEvents(w http.ResponseWriter) *events {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	return &events{w: w, f: f}
}

// send writes one event: "event: NAME" where name is not empty, then data
// as JSON (a string is written as it is, as Chat Completions' [DONE]).
func (e *events) send(name string, data any) {
	if name != "" {
		fmt.Fprintf(e.w, "event: %s\n", name)
	}
	b, ok := data.(string)
	if !ok {
		j, _ := json.Marshal(data)
		b = string(j)
	}
	fmt.Fprintf(e.w, "data: %s\n\n", b)
	if e.f != nil {
		e.f.Flush()
	}
}
