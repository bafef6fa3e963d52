package pgstore_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/fleet"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/idemhttp"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/request/requesttest"
	"github.com/idemq/idemq/testenv"
)

// tenantStore is a Routed store with every call's context naming one
// tenant, as the request's would, so that the conformance suite runs on it.
type tenantStore struct {
	*pgstore.Routed
	tenant string
}

func (s tenantStore) in(ctx context.Context) context.Context {
	return request.WithTenant(ctx, s.tenant)
}

func (s tenantStore) Claim(ctx context.Context, id request.ID, fp []byte, d time.Duration) (request.Claim, error) {
	return s.Routed.Claim(s.in(ctx), id, fp, d)
}
func (s tenantStore) Complete(ctx context.Context, l idemq.Lease, r request.Response) error {
	return s.Routed.Complete(s.in(ctx), l, r)
}
func (s tenantStore) Release(ctx context.Context, l idemq.Lease) error {
	return s.Routed.Release(s.in(ctx), l)
}
func (s tenantStore) Extend(ctx context.Context, l idemq.Lease, d time.Duration) (idemq.Lease, error) {
	return s.Routed.Extend(s.in(ctx), l, d)
}
func (s tenantStore) Get(ctx context.Context, id request.ID) (request.Record, error) {
	return s.Routed.Get(s.in(ctx), id)
}

func newRouted(t testing.TB, ttl time.Duration, dbs ...fleet.Database) *pgstore.Routed {
	t.Helper()
	r, err := pgstore.NewRouted(fleet.Static(dbs...), pgstore.Config{RecordTTL: ttl}, fleet.PoolsConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRoutedConformance(t *testing.T) {
	requesttest.Run(t, requesttest.Harness{
		New: func(t *testing.T, ttl time.Duration) request.Store {
			return tenantStore{newRouted(t, ttl, fleet.Database{Name: "acme", ConnString: testenv.PostgresURL(t)}), "acme"}
		},
		Collect: func(ctx context.Context, s request.Store) error {
			ts := s.(tenantStore)
			st, err := ts.Tenant(ctx, ts.tenant)
			if err != nil {
				return err
			}
			_, err = st.GC(ctx, 0)
			return err
		},
	})
}

// TestRoutedMiddleware serves two tenants through one Idempotency-Key
// middleware, the tenant taken from a header by a handler in front of
// it: the same key in both tenants is two requests, each recorded in its
// own database; a retry in one is replayed; a request without a tenant,
// or of a tenant the fleet does not list, fails closed.
func TestRoutedMiddleware(t *testing.T) {
	t.Parallel()
	acme := fleet.Database{Name: "acme", ConnString: testenv.PostgresURL(t)}
	globex := fleet.Database{Name: "globex", ConnString: testenv.PostgresURL(t)}
	store := newRouted(t, time.Hour, acme, globex)
	m, err := idemhttp.New(store, idemhttp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	h := m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		tenant, _ := request.Tenant(r.Context())
		fmt.Fprintf(w, "order for %s", tenant)
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(request.WithTenant(r.Context(), r.Header.Get("Tenant"))))
	}))
	defer srv.Close()
	post := func(tenant string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "order-1")
		req.Header.Set("Tenant", tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, tenant := range []string{"acme", "globex", "acme", "globex"} {
		if code, body := post(tenant); code != http.StatusOK || body != "order for "+tenant {
			t.Errorf("%s: %d %q", tenant, code, body)
		}
	}
	if runs.Load() != 2 {
		t.Errorf("the handler ran %d times for two tenants' one key each", runs.Load())
	}
	for _, d := range []fleet.Database{acme, globex} {
		pool, err := pgxpool.New(context.Background(), d.ConnString)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		err = pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgstore.TableDefault).Scan(&n)
		pool.Close()
		if err != nil || n != 1 {
			t.Errorf("%s holds %d request records (%v), want 1", d.Name, n, err)
		}
	}
	for _, tenant := range []string{"", "initech"} {
		if code, _ := post(tenant); code != http.StatusServiceUnavailable {
			t.Errorf("tenant %q: %d, want 503", tenant, code)
		}
	}
}
