package idemgrpc

import (
	"fmt"
	"sync"
	"testing"

	grpcgo "google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// rawCodec passes gRPC messages through as bytes, as a proxy does.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" } // keeps content-type application/grpc+proto

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

// meshProxy stands for a retrying service mesh sidecar: it forwards each
// unary call byte for byte with its metadata, and loses the first drop
// responses on the way back, which it answers by retrying the same request,
// as a mesh does after a broken connection.
type meshProxy struct {
	mu      sync.Mutex
	drop    int
	dropped [][]byte // the responses that never reached the client
	tries   int
}

// serveMesh starts a proxy to backend on loopback and returns its address.
func serveMesh(tb testing.TB, backend string, p *meshProxy) string {
	tb.Helper()
	cc, err := grpcgo.NewClient(backend, grpcgo.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cc.Close() })
	return listen(tb, grpcgo.NewServer(grpcgo.ForceServerCodec(rawCodec{}), grpcgo.UnknownServiceHandler(func(_ any, ss grpcgo.ServerStream) error {
		return p.forward(ss, cc)
	})))
}

func (p *meshProxy) forward(ss grpcgo.ServerStream, backend *grpcgo.ClientConn) error {
	method, _ := grpcgo.MethodFromServerStream(ss)
	var req []byte
	if err := ss.RecvMsg(&req); err != nil {
		return err
	}
	md, _ := metadata.FromIncomingContext(ss.Context())
	md = md.Copy()
	for _, h := range []string{":authority", "content-type", "user-agent"} {
		delete(md, h)
	}
	ctx := metadata.NewOutgoingContext(ss.Context(), md)
	for {
		var resp []byte
		var header, trailer metadata.MD
		err := backend.Invoke(ctx, method, &req, &resp, grpcgo.ForceCodec(rawCodec{}), grpcgo.Header(&header), grpcgo.Trailer(&trailer))
		if p.lose(resp) {
			continue
		}
		_ = ss.SetHeader(header)
		ss.SetTrailer(trailer)
		if err != nil {
			return err
		}
		return ss.SendMsg(&resp)
	}
}

// lose reports whether this response is dropped, and keeps it if so.
func (p *meshProxy) lose(resp []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tries++
	if p.drop == 0 {
		return false
	}
	p.drop--
	p.dropped = append(p.dropped, resp)
	return true
}
