package console_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemq/idemq/console"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// Mount the console under /console in a service's own mux, read-only, behind
// basic auth. Set AllowActions (and DB) to let the signed-in operator
// replay and purge.
func ExampleNewHandler() {
	ctx := context.Background()
	pool, drop, err := testenv.ScratchPool(ctx, "idemq_example")
	if err != nil {
		log.Fatal(err)
	}
	defer drop()
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	ui, err := console.NewHandler(console.Config{
		DB:     pool,
		Outbox: ob,
		User:   "ops", Password: "change me",
		Prefix: "/console",
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", ui))

	srv := httptest.NewServer(mux)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/console/", nil)
	req.SetBasicAuth("ops", "change me")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, strings.Contains(string(body), "The outbox is empty"))
	// Output: 200 true
}
