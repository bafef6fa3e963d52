package endpoints_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/transports/webhook/endpoints"
	"github.com/idemq/idemq/transports/webhook/signing"
)

func TestRegistryLifecycle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	secret := signing.NewSecret()
	ep, err := b.reg.Add(b.ctx, endpoints.Endpoint{URL: "https://example.com/hook", Keys: []string{secret}, EventTypes: []string{"invoice.paid"}})
	if err != nil {
		t.Fatal(err)
	}
	if ep.ID == "" || !ep.Enabled() {
		t.Fatalf("added endpoint %+v: want a generated id, enabled", ep)
	}
	ep.URL, ep.Timeout, ep.Concurrency, ep.RateLimit = "https://example.com/v2", 3*time.Second, 2, 10
	if err := b.reg.Update(b.ctx, ep); err != nil {
		t.Fatal(err)
	}
	if err := b.reg.Disable(b.ctx, ep.ID, "maintenance"); err != nil {
		t.Fatal(err)
	}
	got, err := b.reg.Get(b.ctx, ep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.URL != "https://example.com/v2" || got.Timeout != 3*time.Second || got.Concurrency != 2 || got.RateLimit != 10 ||
		got.Enabled() || got.DisabledReason != "maintenance" || len(got.Keys) != 1 || got.Keys[0] != secret {
		t.Fatalf("stored endpoint %+v", got)
	}
	if err := b.reg.Enable(b.ctx, ep.ID); err != nil {
		t.Fatal(err)
	}
	list, err := b.reg.List(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || !list[0].Enabled() {
		t.Fatalf("List: %+v", list)
	}
	if err := b.reg.Remove(b.ctx, ep.ID); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"Get":       func() error { _, err := b.reg.Get(b.ctx, ep.ID); return err }(),
		"Enable":    b.reg.Enable(b.ctx, ep.ID),
		"Disable":   b.reg.Disable(b.ctx, ep.ID, "x"),
		"RotateKey": b.reg.RotateKey(b.ctx, ep.ID, signing.NewSecret(), time.Minute),
		"Update":    b.reg.Update(b.ctx, ep),
	} {
		if !errors.Is(err, endpoints.ErrEndpointNotFound) {
			t.Errorf("%s of a removed endpoint: %v, want ErrEndpointNotFound", name, err)
		}
	}
}

func TestRegistryRefusesBadEndpoints(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, public := signing.NewSigningKey()
	for name, ep := range map[string]endpoints.Endpoint{
		"no key":            {URL: "https://example.com"},
		"only a public key": {URL: "https://example.com", Keys: []string{public}},
		"bad key":           {URL: "https://example.com", Keys: []string{"whsec_short"}},
		"relative URL":      {URL: "/hook", Keys: []string{signing.NewSecret()}},
		"ftp URL":           {URL: "ftp://example.com", Keys: []string{signing.NewSecret()}},
		"bad id":            {ID: "a/b", URL: "https://example.com", Keys: []string{signing.NewSecret()}},
		"negative timeout":  {URL: "https://example.com", Keys: []string{signing.NewSecret()}, Timeout: -1},
		"bad event type":    {URL: "https://example.com", Keys: []string{signing.NewSecret()}, EventTypes: []string{"invoice.*"}},
	} {
		if _, err := b.reg.Add(b.ctx, ep); err == nil {
			t.Errorf("%s: Add accepted %+v", name, ep)
		}
	}
	if _, err := endpoints.NewRegistry(b.pool, endpoints.RegistryConfig{Table: "Bad-Name"}); !errors.Is(err, idemq.ErrConfig) {
		t.Fatalf("bad table name: %v, want ErrConfig", err)
	}
}

// TestFanOutOneRowPerSubscribedEndpoint: an event becomes one row per
// enabled endpoint whose filter takes its type, in the caller's
// transaction: a rollback writes nothing.
func TestFanOutOneRowPerSubscribedEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	all := addEndpoint(t, b, "https://a.example", nil)
	paid := addEndpoint(t, b, "https://b.example", func(e *endpoints.Endpoint) { e.EventTypes = []string{"invoice.paid"} })
	off := addEndpoint(t, b, "https://c.example", nil)
	if err := b.reg.Disable(b.ctx, off.ID, "off"); err != nil {
		t.Fatal(err)
	}
	rollback := errors.New("rollback")
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := b.pub.PublishTx(b.ctx, tx, endpoints.Event{Type: "invoice.paid", Data: []byte(`{}`)}); err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatal(err)
	}
	if n := pending(t, b); n != 0 {
		t.Fatalf("%d rows after a rollback, want 0", n)
	}
	if n := publish(t, b, endpoints.Event{Type: "invoice.paid", Key: "inv1", Data: []byte(`{"id":1}`)}, endpoints.Event{Type: "invoice.sent", Data: []byte(`{}`)}); n != 3 {
		t.Fatalf("PublishTx wrote %d rows, want 3 (paid to two endpoints, sent to one)", n)
	}
	rows, err := b.pool.Query(b.ctx, `SELECT destination, coalesce(key, '') FROM idemq_outbox ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Dest, Key string }])
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{endpoints.DestinationPrefix + all.ID: all.ID + "/inv1", endpoints.DestinationPrefix + paid.ID: paid.ID + "/inv1"}
	for _, r := range got[:2] {
		if want[r.Dest] != r.Key {
			t.Fatalf("row %+v: want the key scoped to its endpoint", r)
		}
	}
	if got[2].Dest != endpoints.DestinationPrefix+all.ID || got[2].Key != "" {
		t.Fatalf("third row %+v: want invoice.sent to the unfiltered endpoint, unkeyed", got[2])
	}
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := b.pub.PublishTx(b.ctx, tx, endpoints.Event{Type: "bad type!", Data: []byte(`{}`)})
		return err
	})
	if !errors.Is(err, endpoints.ErrInvalidEvent) {
		t.Fatalf("bad type: %v, want ErrInvalidEvent", err)
	}
}
