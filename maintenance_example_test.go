package idemq_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/idemq/idemq"
)

// A service of chores runs beside a consumer or a relay; a store's
// Chores (inbox.Store.Chores, outbox.Outbox.Chores, pgstore.Store.Chores)
// are what it usually runs. RunOnce is the single pass of idemq gc.
func ExampleMaintenance_RunOnce() {
	m, err := idemq.NewMaintenance(quiet, idemq.Chore{
		Name:  "count",
		Every: time.Minute,
		Run:   func(context.Context) (int64, error) { return 3, nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	results, err := m.RunOnce(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range results {
		fmt.Println(r.Name, r.Done)
	}
	// Output: count 3
}
