// Command grpc-orders shows idemq's gRPC interceptors keeping a retried
// CreateOrder to one order. A network that loses responses is injected
// between client and server: the server creates the order, the reply is
// dropped, the client retries the call with the same idempotency key, and
// the server answers from its record instead of creating a second order.
// The server writes the order and the request record in one Postgres
// transaction, so that "applied" and "recorded" cannot diverge.
//
// It prints what the client sent and what the database holds, and exits
// non-zero unless there is exactly one order per logical call and every
// retry got the original response.
//
// It runs as a module of its own: copy this file into a new module and `go
// run .` (the generated orderspb package is imported from idemq's module).
// It needs Postgres at DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/postgres), where it drops and recreates
// the schema grpc_orders on every run.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/examples/grpc-orders/orderspb"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/idemgrpc"
	"github.com/idemq/idemq/request/pgstore"
)

const (
	calls     = 20 // logical CreateOrder calls
	dropEvery = 3  // the network loses the first reply of every third call

	schema = "grpc_orders" // holds the example's tables; recreated on every run
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err := func() error {
		pool, err := openPool(ctx, cmp.Or(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres"))
		if err != nil {
			return err
		}
		defer pool.Close()
		return run(ctx, pool, os.Stdout)
	}()
	cancel()
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "grpc-orders: %v\n", err)
		os.Exit(1)
	}
}

// openPool opens a pool on connString whose connections work in schema,
// which it drops and recreates first so that every run starts empty.
func openPool(ctx context.Context, connString string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	name := pgx.Identifier{schema}.Sanitize()
	for _, sql := range []string{"DROP SCHEMA IF EXISTS " + name + " CASCADE", "CREATE SCHEMA " + name} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			pool.Close()
			return nil, fmt.Errorf("postgres: %w", err)
		}
	}
	return pool, nil
}

// run is what a service of your own would do, with its pool.
func run(ctx context.Context, pool *pgxpool.Pool, out io.Writer) (err error) {
	store, err := pgstore.New(pool, pgstore.Config{Schema: schema})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (
		id bigserial PRIMARY KEY, customer text NOT NULL, total_cents bigint NOT NULL)`); err != nil {
		return err
	}

	// The server: a lossy network in front of the idempotency interceptor.
	idempotent, err := idemgrpc.UnaryServerInterceptor(store, idemgrpc.ServerConfig{
		Methods: []string{orderspb.Orders_CreateOrder_FullMethodName},
	})
	if err != nil {
		return err
	}
	lossy := &lossyNetwork{every: dropEvery}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(lossy.intercept, idempotent))
	orderspb.RegisterOrdersServer(srv, &orders{pool: pool, store: store})
	addr, stop, err := listen(srv)
	if err != nil {
		return err
	}
	defer stop()

	// The client: one key per logical call, kept by every retry.
	keys, err := idemgrpc.UnaryClientInterceptor(idemgrpc.ClientConfig{
		Retry: idemq.Retry{MaxAttempts: 4, BaseDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond},
	})
	if err != nil {
		return err
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(keys))
	if err != nil {
		return err
	}
	defer cc.Close()
	client := orderspb.NewOrdersClient(cc)

	got := make([]*orderspb.Order, calls)
	replays := 0
	for i := range calls {
		var trailer metadata.MD
		got[i], err = client.CreateOrder(ctx, &orderspb.CreateOrderRequest{
			CustomerId: fmt.Sprintf("customer-%02d", i),
			Items:      []*orderspb.LineItem{{Sku: "tea", Quantity: int32(i%3 + 1), UnitPriceCents: 450}},
		}, grpc.Trailer(&trailer))
		if err != nil {
			return fmt.Errorf("CreateOrder %d: %w", i, err)
		}
		if len(trailer.Get(idemgrpc.ReplayedTrailer)) > 0 {
			replays++
		}
	}
	return report(ctx, out, pool, lossy, got, replays)
}

// report checks the outcome against the database and prints it.
func report(ctx context.Context, out io.Writer, pool *pgxpool.Pool, lossy *lossyNetwork, got []*orderspb.Order, replays int) error {
	rows, err := pool.Query(ctx, `SELECT id, customer, total_cents FROM orders ORDER BY id`)
	if err != nil {
		return err
	}
	stored, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*orderspb.Order, error) {
		var id int64
		o := &orderspb.Order{}
		err := r.Scan(&id, &o.CustomerId, &o.TotalCents)
		o.OrderId = fmt.Sprintf("order-%d", id)
		return o, err
	})
	if err != nil {
		return err
	}
	dropped, served := lossy.counts()
	fmt.Fprintf(out, "logical calls:      %d\n", len(got))
	fmt.Fprintf(out, "responses dropped:  %d (the order was created, the reply lost)\n", dropped)
	fmt.Fprintf(out, "calls served:       %d\n", served)
	fmt.Fprintf(out, "replayed responses: %d\n", replays)
	fmt.Fprintf(out, "orders in database: %d\n", len(stored))
	switch {
	case len(stored) != len(got):
		return fmt.Errorf("%d orders for %d calls", len(stored), len(got))
	case replays != dropped:
		return fmt.Errorf("%d replays for %d dropped responses", replays, dropped)
	}
	for i := range got {
		if !proto.Equal(got[i], stored[i]) {
			return fmt.Errorf("call %d got %v, the database holds %v", i, got[i], stored[i])
		}
	}
	fmt.Fprintln(out, "ok: one order per call, and every retry got the original response")
	return nil
}

// orders is the Orders service.
type orders struct {
	orderspb.UnimplementedOrdersServer
	pool  *pgxpool.Pool
	store *pgstore.Store
}

// CreateOrder inserts the order and completes the request record in one
// transaction: if the call's lease was taken over meanwhile, the record is
// refused and the insert rolls back.
func (s *orders) CreateOrder(ctx context.Context, req *orderspb.CreateOrderRequest) (*orderspb.Order, error) {
	if req.CustomerId == "" || len(req.Items) == 0 {
		return nil, status.Error(codes.InvalidArgument, "an order needs a customer and items")
	}
	order := &orderspb.Order{CustomerId: req.CustomerId}
	for _, it := range req.Items {
		order.TotalCents += int64(it.Quantity) * it.UnitPriceCents
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO orders (customer, total_cents) VALUES ($1, $2) RETURNING id`,
			order.CustomerId, order.TotalCents).Scan(&id); err != nil {
			return err
		}
		order.OrderId = fmt.Sprintf("order-%d", id)
		return idemgrpc.Record(ctx, order, func(l idemq.Lease, r request.Response) error {
			return s.store.CompleteTx(ctx, tx, l, r)
		})
	})
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "create order: %v", err)
	}
	return order, nil
}

// lossyNetwork stands for the network between client and server: it lets
// every call reach the server and run, then loses the reply of the first
// attempt of every n-th logical call, which the client sees as UNAVAILABLE.
type lossyNetwork struct {
	every int

	mu      sync.Mutex
	seen    map[string]bool // keys whose first attempt has passed
	dropped int
	served  atomic.Int64
}

func (n *lossyNetwork) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	n.served.Add(1)
	resp, err := handler(ctx, req)
	md, _ := metadata.FromIncomingContext(ctx)
	key := firstOf(md.Get(idemgrpc.MetadataKey))
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.seen == nil {
		n.seen = map[string]bool{}
	}
	first := !n.seen[key]
	n.seen[key] = true
	if first && len(n.seen)%n.every == 0 {
		n.dropped++
		return nil, status.Error(codes.Unavailable, "connection reset: the reply was lost")
	}
	return resp, err
}

func (n *lossyNetwork) counts() (dropped, served int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.dropped, int(n.served.Load())
}

func firstOf(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

// listen serves srv on a loopback port.
func listen(srv *grpc.Server) (addr string, stop func(), err error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	return lis.Addr().String(), func() {
		srv.GracefulStop()
		if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			fmt.Fprintln(os.Stderr, "grpc-orders: serve:", err)
		}
	}, nil
}
