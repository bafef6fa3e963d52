package idemgrpc

import (
	"context"
	"strings"
	"sync"

	grpcgo "google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// trailerPrefix sets a stored trailer apart from a stored header; a
// metadata key never contains ':'.
const trailerPrefix = "trailer:"

// metadataCapture records the header and trailer metadata a handler sets,
// so that a replay sends them too, and passes them on to the real stream.
type metadataCapture struct {
	grpcgo.ServerTransportStream

	mu              sync.Mutex
	header, trailer metadata.MD
}

// captureMetadata returns ctx with a stream that records the handler's
// metadata, or ctx and nil outside a gRPC server.
func captureMetadata(ctx context.Context) (context.Context, *metadataCapture) {
	stream := grpcgo.ServerTransportStreamFromContext(ctx)
	if stream == nil {
		return ctx, nil
	}
	c := &metadataCapture{ServerTransportStream: stream}
	return grpcgo.NewContextWithServerTransportStream(ctx, c), c
}

func (c *metadataCapture) add(into *metadata.MD, md metadata.MD) {
	c.mu.Lock()
	defer c.mu.Unlock()
	*into = metadata.Join(*into, md)
}

// SetHeader implements grpc.ServerTransportStream.
func (c *metadataCapture) SetHeader(md metadata.MD) error {
	c.add(&c.header, md)
	return c.ServerTransportStream.SetHeader(md)
}

// SendHeader implements grpc.ServerTransportStream.
func (c *metadataCapture) SendHeader(md metadata.MD) error {
	c.add(&c.header, md)
	return c.ServerTransportStream.SendHeader(md)
}

// SetTrailer implements grpc.ServerTransportStream.
func (c *metadataCapture) SetTrailer(md metadata.MD) error {
	c.add(&c.trailer, md)
	return c.ServerTransportStream.SetTrailer(md)
}

// stored returns the captured metadata in the form of a stored response's
// Header; nil when there is none.
func (c *metadataCapture) stored() map[string][]string {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.header)+len(c.trailer) == 0 {
		return nil
	}
	h := make(map[string][]string, len(c.header)+len(c.trailer))
	for k, v := range c.header {
		h[k] = v
	}
	for k, v := range c.trailer {
		h[trailerPrefix+k] = v
	}
	return h
}

// replayMetadata sends stored metadata with a replayed outcome.
func replayMetadata(ctx context.Context, stored map[string][]string) {
	header, trailer := metadata.MD{}, metadata.MD{}
	for k, v := range stored {
		if name, ok := strings.CutPrefix(k, trailerPrefix); ok {
			trailer[name] = v
		} else {
			header[k] = v
		}
	}
	if len(header) > 0 {
		_ = grpcgo.SetHeader(ctx, header)
	}
	if len(trailer) > 0 {
		_ = grpcgo.SetTrailer(ctx, trailer)
	}
}
