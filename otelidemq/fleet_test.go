package otelidemq_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/fleet"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

// TestObserveFleet: a fleet of one migrated database and 12 that do not
// exist reports per server (one series per state, not per database) and
// names only the 10 longest-failing databases.
func TestObserveFleet(t *testing.T) {
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	good := fleet.Database{Name: "good", ConnString: url}
	if err := migrateOutbox(ctx, good); err != nil {
		t.Fatal(err)
	}
	dbs := []fleet.Database{good}
	for i := range 12 {
		dbs = append(dbs, fleet.Database{Name: fmt.Sprintf("gone-%02d", i), ConnString: strings.Replace(url, "/idemq_test_", fmt.Sprintf("/idemq_gone%02d_", i), 1)})
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	f, err := relay.NewFleet(fleet.Static(dbs...), relay.SinkFunc(func(context.Context, relay.BatchID, []relay.Message) error { return nil }),
		relay.FleetConfig{Relay: relay.Config{Logger: quiet}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	running, err := idemq.Start(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Stop()
	reg, tel := prometheusTelemetry(t)
	if _, err := tel.ObserveFleet(nil); err == nil {
		t.Error("ObserveFleet(nil) accepted")
	}
	if _, err := tel.ObserveFleet(f); err != nil {
		t.Fatal(err)
	}
	server, _ := good.Server()
	var series map[string]float64
	idemqtest.WaitFor(t, "12 failing databases reported", func() bool {
		series = scrape(t, reg)
		return series[`idemq_fleet_databases{idemq_fleet_state="failing",server_address="`+server+`"}`] == 12
	}, idemqtest.Explain(func() string { return fmt.Sprint(series) }))
	named := 0
	for name := range series {
		if strings.HasPrefix(name, "idemq_fleet_failing_duration_seconds{") {
			named++
		}
	}
	if named != 10 {
		t.Errorf("%d failing databases named; want the 10 longest-failing", named)
	}
	if _, ok := series[`idemq_fleet_connections{server_address="`+server+`"}`]; !ok {
		t.Errorf("no connections gauge for %s: %v", server, series)
	}
}

// migrateOutbox migrates the outbox of d.
func migrateOutbox(ctx context.Context, d fleet.Database) error {
	results := fleet.Each(ctx, []fleet.Database{d}, 1, func(ctx context.Context, _ fleet.Database, conn *pgx.Conn) error {
		ob, err := outbox.New(conn, outbox.Config{})
		if err != nil {
			return err
		}
		return ob.Migrate(ctx)
	})
	return results[0].Err
}
