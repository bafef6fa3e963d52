package request

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Response is the outcome of a request that a store keeps for replay. Its
// meaning belongs to the front end: the HTTP middleware stores the status
// code, the allow-listed headers and the body; the gRPC interceptor the
// status code, metadata and the marshalled message.
type Response struct {
	Status int
	Header map[string][]string
	Body   []byte
	// Omitted is the size of a body that was too large to keep (over the
	// front end's limit or the store's); Body is then empty. A replay must
	// not pass such a response off as the original: front ends answer it
	// with an error that says the outcome stands but its body was not kept.
	Omitted int
}

// The versions that lead every encoded Response, so that the encoding can
// change without misreading records written before. Version 2 adds
// Omitted; a response without it is still written as version 1, which
// every release reads.
const (
	responseVersion        = 1
	responseVersionOmitted = 2
)

// MarshalBinary encodes r compactly: a version byte, then varint lengths
// and the raw bytes. Stores keep it as one opaque value.
func (r Response) MarshalBinary() ([]byte, error) {
	if r.Status < 0 || r.Omitted < 0 {
		return nil, fmt.Errorf("request: negative status %d or omitted size %d", r.Status, r.Omitted)
	}
	size := 1 + 3*binary.MaxVarintLen64 + len(r.Body)
	for name, values := range r.Header {
		size += 2*binary.MaxVarintLen64 + len(name)
		for _, v := range values {
			size += binary.MaxVarintLen64 + len(v)
		}
	}
	b := make([]byte, 0, size)
	if r.Omitted > 0 {
		b = binary.AppendUvarint(append(b, responseVersionOmitted), uint64(r.Omitted))
	} else {
		b = append(b, responseVersion)
	}
	b = binary.AppendUvarint(b, uint64(r.Status))
	b = binary.AppendUvarint(b, uint64(len(r.Header)))
	for name, values := range r.Header {
		b = appendBytes(b, name)
		b = binary.AppendUvarint(b, uint64(len(values)))
		for _, v := range values {
			b = appendBytes(b, v)
		}
	}
	return appendBytes(b, string(r.Body)), nil
}

func appendBytes(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

var errResponseEncoding = errors.New("request: malformed stored response")

// UnmarshalBinary decodes what MarshalBinary encoded.
func (r *Response) UnmarshalBinary(b []byte) error {
	if len(b) == 0 || (b[0] != responseVersion && b[0] != responseVersionOmitted) {
		return fmt.Errorf("%w: unknown version", errResponseEncoding)
	}
	d := decoder{b: b[1:]}
	*r = Response{}
	if b[0] == responseVersionOmitted {
		n := d.uvarint()
		if n > math.MaxInt32 {
			return errResponseEncoding
		}
		r.Omitted = int(n)
	}
	r.Status = int(d.uvarint())
	if n := d.uvarint(); n > 0 && d.err == nil {
		if n > uint64(len(d.b)) {
			return errResponseEncoding
		}
		r.Header = make(map[string][]string, n)
		for range n {
			name := d.string()
			values := make([]string, min(d.uvarint(), uint64(len(d.b))))
			for i := range values {
				values[i] = d.string()
			}
			r.Header[name] = values
		}
	}
	if body := d.string(); body != "" {
		r.Body = []byte(body)
	}
	if d.err != nil || len(d.b) != 0 {
		return errResponseEncoding
	}
	return nil
}

// decoder reads varints and length-prefixed strings, remembering the first
// error so that callers check once.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errResponseEncoding
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.err != nil || n > uint64(len(d.b)) {
		d.err = errResponseEncoding
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
