package requesttest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemq/idemq/request"
)

// Fill stores n completed records shaped as the HTTP middleware writes
// them for a typical create call: a tenant scope, a UUID key, a SHA-256
// fingerprint, status 201 with Content-Type and Location and a small JSON
// body. The stores' size benchmarks measure what these cost.
func Fill(tb testing.TB, s request.Store, n int) {
	tb.Helper()
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				id := request.ID{Scope: "tenant-42", Key: uuid.NewString()}
				body := fmt.Sprintf(`{"order":%d,"status":"created","amount":"10.00"}`, i)
				c, err := s.Claim(ctx, id, request.Fingerprint([]byte("POST"), []byte("/orders"), []byte(body)), time.Minute)
				if err == nil && c.Acquired {
					err = s.Complete(ctx, c.Lease, request.Response{Status: 201, Body: []byte(body), Header: map[string][]string{
						"Content-Type": {"application/json"}, "Location": {fmt.Sprintf("/orders/%d", i)},
					}})
				}
				if err != nil {
					tb.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
