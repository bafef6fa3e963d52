package idemhttp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	nethttp "net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/dynamostore"
	"github.com/idemq/idemq/request/idemhttp"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/request/redisstore"
	"github.com/idemq/idemq/request/requesttest"
	"github.com/idemq/idemq/testenv"
)

// The crash tests run the server in a child process (this test binary
// re-executed with crashChildEnv set) and SIGKILL it.
const (
	crashChildEnv = "IDEMQ_IDEMHTTP_CRASH_CHILD"
	killMarker    = "idemhttp crash child: kill me now"
	addrPrefix    = "idemhttp crash child: serving on "
)

// crashSpec is what a child server is told.
type crashSpec struct {
	DatabaseURL string
	// Store is one of crashStores.
	Store string
	// StoreURL and Prefix locate the Redis or DynamoDB store: its server,
	// and its key prefix or table.
	StoreURL, Prefix string
	// Block makes the handler announce itself and block until killed.
	Block bool
}

// crashStores are the ways a handler that writes to Postgres can run:
// its response stored after its commit, in Redis or DynamoDB; recorded in
// its own transaction (idemhttp.Record); in the middleware's transaction
// (Config.OwnTransaction).
var crashStores = []string{"redis", "dynamodb", "postgres-record", "postgres-tx"}

// crashEnv opens what a crash test and its children share: the database
// with the effects table (one row per run of the handler, no unique key)
// and the spec.
func crashEnv(t *testing.T, store string) (crashSpec, *pgxpool.Pool) {
	spec := crashSpec{DatabaseURL: testenv.PostgresURL(t), Store: store}
	switch store {
	case "redis":
		_, spec.Prefix = testenv.Redis(t)
		spec.StoreURL = testenv.RedisURL()
	case "dynamodb":
		// A dynalite of the test's own: the SIGKILLs cut its clients'
		// connections, which the shared one's other tests must not see.
		d := testenv.StartDynalite(t)
		spec.StoreURL, spec.Prefix = d.URL(), "requests"
		requesttest.Dynamo(t, d.Client(), spec.Prefix) // creates the table
	}
	pool, err := pgxpool.New(context.Background(), spec.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (seq bigserial PRIMARY KEY, key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return spec, pool
}

// crashServer returns the middleware-wrapped handler of spec: it inserts
// one effects row per run and answers 201, in the way spec.Store says.
func crashServer(tb testing.TB, spec crashSpec, pool *pgxpool.Pool) nethttp.Handler {
	tb.Helper()
	ctx := context.Background()
	var store request.Store
	var pg *pgstore.Store
	var err error
	switch spec.Store {
	case "redis":
		opts, perr := redis.ParseURL(spec.StoreURL)
		if perr != nil {
			tb.Fatal(perr)
		}
		rdb := redis.NewClient(opts)
		tb.Cleanup(func() { _ = rdb.Close() })
		store, err = redisstore.New(ctx, rdb, redisstore.Config{Prefix: spec.Prefix})
	case "dynamodb":
		store, err = dynamostore.New(testenv.DynamoDBClient(spec.StoreURL), dynamostore.Config{Table: spec.Prefix})
	default:
		if pg, err = pgstore.New(pool, pgstore.Config{}); err == nil {
			err = pg.Migrate(ctx)
		}
		store = pg
	}
	if err != nil {
		tb.Fatal(err)
	}
	m, err := idemhttp.New(store, idemhttp.Config{OwnTransaction: spec.Store == "postgres-tx"})
	if err != nil {
		tb.Fatal(err)
	}
	apply := func(w nethttp.ResponseWriter, r *nethttp.Request, tx pgx.Tx) error {
		key := strings.Trim(r.Header.Get(idemhttp.HeaderKey), `"`)
		if _, err := tx.Exec(r.Context(), `INSERT INTO effects (key) VALUES ($1)`, key); err != nil {
			return err
		}
		if spec.Block {
			fmt.Println(killMarker)
			select {}
		}
		w.WriteHeader(nethttp.StatusCreated)
		fmt.Fprintf(w, "applied %s", key)
		if spec.Store != "postgres-record" {
			return nil
		}
		return idemhttp.Record(r, func(l idemq.Lease, resp request.Response) error { return pg.CompleteTx(r.Context(), tx, l, resp) })
	}
	return m.Wrap(nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		var err error
		if tx, ok := pgstore.Tx(r.Context()); ok {
			err = apply(w, r, tx)
		} else {
			err = pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error { return apply(w, r, tx) })
		}
		if err != nil {
			nethttp.Error(w, err.Error(), nethttp.StatusInternalServerError)
		}
	}))
}

// crashChild is the child process: the server of its spec on a loopback
// port until it is killed (or, if the parent vanished, for two minutes).
func crashChild(t *testing.T) bool {
	v := os.Getenv(crashChildEnv)
	if v == "" {
		return false
	}
	var spec crashSpec
	if err := json.Unmarshal([]byte(v), &spec); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(context.Background(), spec.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(crashServer(t, spec, pool))
	fmt.Println(addrPrefix + srv.URL)
	time.Sleep(2 * time.Minute)
	return true
}

// child is a running child server.
type child struct {
	cmd    *exec.Cmd
	url    string
	killMe chan struct{} // closed when the handler announced itself
}

// startChild runs test as a child server of spec and waits for its URL.
func startChild(t *testing.T, test string, spec crashSpec) *child {
	t.Helper()
	env, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+string(env))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := &child{cmd: cmd, killMe: make(chan struct{})}
	urls := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(out)
		for lines.Scan() {
			switch line := lines.Text(); {
			case strings.HasPrefix(line, addrPrefix):
				urls <- strings.TrimPrefix(line, addrPrefix)
			case line == killMarker:
				close(c.killMe)
			}
		}
		close(urls)
	}()
	select {
	case u, ok := <-urls:
		if !ok {
			t.Fatal("the child server exited before it served")
		}
		c.url = u
	case <-time.After(time.Minute):
		t.Fatal("the child server did not start within a minute")
	}
	return c
}

// kill SIGKILLs the child and reaps it.
func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
}

// effects returns how often the handler ran for each key.
func effects(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT key, count(*) FROM effects GROUP BY key`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	var key string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&key, &n}, func() error { got[key] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestCrashedHolderFreesKeyWithinLease: a server SIGKILLed while its
// handler runs holds the key for at most one short lease (5 s by
// default, renewed while the handler ran), not 30 s: the record's lease
// at the kill ends within LeaseDefault, and a retry to another server then
// runs the request. The handler's uncommitted work died with the process.
func TestCrashedHolderFreesKeyWithinLease(t *testing.T) {
	if crashChild(t) {
		return
	}
	t.Parallel()
	spec, pool := crashEnv(t, "postgres-record")
	spec.Block = true
	c := startChild(t, "TestCrashedHolderFreesKeyWithinLease", spec)
	key := uuid.NewString()
	go func() {
		req, _ := nethttp.NewRequest(nethttp.MethodPost, c.url+"/orders", strings.NewReader("{}"))
		req.Header.Set(idemhttp.HeaderKey, quoted(key))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := client.Do(req); err == nil {
			_ = resp.Body.Close() // the server dies: no answer expected
		}
	}()
	select {
	case <-c.killMe:
	case <-time.After(time.Minute):
		t.Fatal("the child's handler never ran")
	}
	time.Sleep(request.LeaseDefault / 2) // let the child renew its lease once or more
	c.kill(t)
	killed := time.Now()

	spec.Block = false
	survivor := httptest.NewServer(crashServer(t, spec, pool))
	t.Cleanup(survivor.Close)
	store, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := store.Get(context.Background(), request.ID{Key: key})
	if err != nil || rec.State != request.InProgress {
		t.Fatalf("record after the kill: %+v, %v; want IN_PROGRESS", rec, err)
	}
	if held := rec.LeaseUntil.Sub(killed); held > request.LeaseDefault+time.Second {
		t.Fatalf("the dead holder's lease runs %v past the kill, want at most the %v lease", held, request.LeaseDefault)
	}
	r := retryUntilDone(t, survivor.URL, quoted(key))
	t.Logf("the retry ran %v after the SIGKILL (lease %v)", time.Since(killed).Round(100*time.Millisecond), request.LeaseDefault)
	if r.status != nethttp.StatusCreated || r.replayed() {
		t.Fatalf("retry after the crash: %+v, want 201 from a new run", r)
	}
	if got := effects(t, pool); got[key] != 1 {
		t.Fatalf("effects %v, want one committed run", got)
	}
}

// TestCrashBetweenCommitAndStore measures what the Redis and DynamoDB
// stores cannot promise: the handler commits in Postgres, then the
// response is stored elsewhere, and a SIGKILL between the two runs the
// handler again on the client's retry. Rounds of concurrent requests are
// cut by a SIGKILL at a random moment; every request is then retried until
// it succeeds, and the requests run twice are counted and logged for each
// store. With the response committed with the effects, in the handler's
// transaction (Record) or in the middleware's (OwnTransaction), no key may
// run twice.
func TestCrashBetweenCommitAndStore(t *testing.T) {
	if crashChild(t) {
		return
	}
	for _, name := range crashStores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			spec, pool := crashEnv(t, name)
			const rounds, workers = 5, 8
			var keys []string
			for range rounds {
				c := startChild(t, "TestCrashBetweenCommitAndStore", spec)
				var mu sync.Mutex
				stop := make(chan struct{})
				var wg sync.WaitGroup
				for range workers {
					wg.Go(func() {
						for {
							select {
							case <-stop:
								return
							default:
							}
							key := uuid.NewString()
							mu.Lock()
							keys = append(keys, key)
							mu.Unlock()
							req, _ := nethttp.NewRequest(nethttp.MethodPost, c.url+"/orders", strings.NewReader("{}"))
							req.Header.Set(idemhttp.HeaderKey, quoted(key))
							req.Header.Set("Content-Type", "application/json")
							resp, err := client.Do(req)
							if err != nil {
								return // the server died
							}
							_ = resp.Body.Close()
						}
					})
				}
				time.Sleep(time.Duration(200+rand.IntN(400)) * time.Millisecond)
				c.kill(t)
				close(stop)
				wg.Wait()
			}
			survivor := httptest.NewServer(crashServer(t, spec, pool))
			t.Cleanup(survivor.Close)
			for _, key := range keys {
				if r := retryUntilDone(t, survivor.URL, quoted(key)); r.status != nethttp.StatusCreated || r.body != "applied "+key {
					t.Fatalf("retry of %s: %+v", key, r)
				}
			}
			got := effects(t, pool)
			twice := 0
			for _, key := range keys {
				switch n := got[key]; {
				case n == 0:
					t.Errorf("key %s never applied", key)
				case n > 1:
					twice++
				}
			}
			t.Logf("%s: %d of %d requests ran twice after %d SIGKILLs under load", name, twice, len(keys), rounds)
			if strings.HasPrefix(name, "postgres") && twice > 0 {
				t.Fatalf("%s ran %d requests twice", name, twice)
			}
		})
	}
}
