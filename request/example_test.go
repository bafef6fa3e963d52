package request_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/testenv"
)

// How a front end runs a request once per key with a Guard: Begin decides,
// the caller runs the request under the attempt's context and completes it
// with the response, and every retry gets that response replayed.
func ExampleGuard() {
	ctx := context.Background()
	pool, done, err := testenv.ScratchPool(ctx, "example_request")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer done()
	store, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := store.Migrate(ctx); err != nil {
		fmt.Println(err)
		return
	}
	g, err := request.New(store, request.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}

	serve := func(id request.ID, body string) {
		d, err := g.Begin(ctx, id, request.Fingerprint([]byte("CreateOrder"), []byte(body)))
		var conflict *request.ConflictError
		switch {
		case errors.As(err, &conflict):
			fmt.Println("rejected: the key was used for another request")
		case err != nil:
			fmt.Println("error:", err)
		case d.Replay != nil:
			fmt.Println("replayed:", string(d.Replay.Response.Body))
		default:
			// Run the request under d.Run.Context(), then store its outcome.
			out := "order for " + body
			if err := d.Run.Complete(request.Response{Status: 201, Body: []byte(out)}); err != nil {
				fmt.Println("complete:", err)
				return
			}
			fmt.Println("ran:", out)
		}
	}
	id := request.ID{Scope: "tenant-1", Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"}
	serve(id, "sku-1")
	serve(id, "sku-1")
	serve(id, "sku-2")
	// Output:
	// ran: order for sku-1
	// replayed: order for sku-1
	// rejected: the key was used for another request
}
