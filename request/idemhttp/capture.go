package idemhttp

import (
	"bytes"
	"errors"
	nethttp "net/http"
)

// ErrRecorded is returned by writes after [Record] stored the response:
// the stored response and the one sent must be the same.
var ErrRecorded = errors.New("http: the response was recorded; nothing may be written after Record")

// capture buffers the handler's response so that it is stored before the
// client sees it: a client must never hold a response whose record was
// refused by the fence. A response over max bytes is sent through as it
// comes (overflow) and stored without its body, whose size counts.
type capture struct {
	w      nethttp.ResponseWriter
	header nethttp.Header
	status int
	body   bytes.Buffer
	max    int

	overflow bool
	size     int
	recorded bool
}

func newCapture(w nethttp.ResponseWriter, max int) *capture {
	return &capture{w: w, header: nethttp.Header{}, max: max}
}

func (c *capture) Header() nethttp.Header { return c.header }

func (c *capture) WriteHeader(status int) {
	if c.status != 0 || c.recorded || status < 200 {
		// Informational responses (103 Early Hints) are not part of the
		// outcome; a second WriteHeader is ignored, as net/http does.
		return
	}
	c.status = status
}

func (c *capture) Write(p []byte) (int, error) {
	if c.recorded {
		return 0, ErrRecorded
	}
	if c.status == 0 {
		c.WriteHeader(nethttp.StatusOK)
	}
	if c.overflow {
		return c.pass(p)
	}
	if c.body.Len()+len(p) <= c.max {
		return c.body.Write(p)
	}
	// Over the cap: this response cannot be replayed in full. Send what
	// we have and stream the rest.
	c.overflow = true
	c.sendHead(nil)
	if _, err := c.pass(c.body.Bytes()); err != nil {
		return 0, err
	}
	c.body = bytes.Buffer{}
	return c.pass(p)
}

// pass writes p through to the client and counts it in the body's size,
// whether or not the client is still there to read it.
func (c *capture) pass(p []byte) (int, error) {
	c.size += len(p)
	return c.w.Write(p)
}

// reset discards the response written so far, unless it went out.
func (c *capture) reset() {
	if c.overflow {
		return
	}
	clear(c.header)
	c.status = 0
	c.body.Reset()
}

// Flush is accepted and ignored: the response is held until it is
// stored. Protected routes do not stream.
func (c *capture) Flush() {}

// statusOr returns the status written, 200 if the handler wrote nothing.
func (c *capture) statusOr() int {
	if c.status == 0 {
		return nethttp.StatusOK
	}
	return c.status
}

// sendHead writes the captured header and status, plus extra headers.
func (c *capture) sendHead(extra nethttp.Header) {
	h := c.w.Header()
	for k, v := range c.header {
		h[k] = v
	}
	for k, v := range extra {
		h[k] = v
	}
	c.w.WriteHeader(c.statusOr())
}

// send delivers the buffered response, unless it overflowed and went out
// already.
func (c *capture) send(extra nethttp.Header) {
	if c.overflow {
		return
	}
	c.sendHead(extra)
	_, _ = c.w.Write(c.body.Bytes())
}
