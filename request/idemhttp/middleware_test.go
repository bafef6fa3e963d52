package idemhttp_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	nethttp "net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/idemhttp"
	"github.com/idemq/idemq/request/requesttest"
)

// forEachStore runs fn as a parallel subtest per store.
func forEachStore(t *testing.T, fn func(t *testing.T, s request.Store)) {
	for _, kind := range requesttest.Kinds {
		t.Run(kind.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, kind.Open(t))
		})
	}
}

// server serves h behind the middleware on a loopback server.
func server(t *testing.T, s request.Store, cfg idemhttp.Config, h nethttp.HandlerFunc) *httptest.Server {
	t.Helper()
	return serverWith(t, s, cfg, h)
}

func serverWith(t *testing.T, s request.Store, cfg idemhttp.Config, h nethttp.Handler) *httptest.Server {
	t.Helper()
	m, err := idemhttp.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Wrap(h))
	t.Cleanup(srv.Close)
	return srv
}

type reply struct {
	status int
	header nethttp.Header
	body   string
	// err is why no reply came, for a request sent off the test's
	// goroutine (see send), which must not call t.Fatal.
	err error
}

// patient is a Guard configuration for the tests of many concurrent
// requests: a loaded store must not turn them into 503s or takeovers.
var patient = request.Config{StoreTimeout: 30 * time.Second, Lease: 30 * time.Second}

func (r reply) replayed() bool { return r.header.Get(idemhttp.HeaderReplayed) == "true" }

// client gives up on a request that gets no answer, so a middleware that
// leaves one unanswered fails the test instead of hanging it.
var client = &nethttp.Client{Timeout: requesttest.WaitTimeout}

// post sends a POST with key (none if empty; taken as the raw header
// value if it starts with a quote or contains a space) and body.
func post(t *testing.T, url, key, body string) reply {
	t.Helper()
	return check(t, send(url, key, body))
}

// send is post for a goroutine other than the test's: the error, if any,
// is in reply.err, for the test's goroutine to report (see recv).
func send(url, key, body string) reply {
	req, err := nethttp.NewRequest(nethttp.MethodPost, url+"/orders", strings.NewReader(body))
	if err != nil {
		return reply{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idemhttp.HeaderKey, key)
	}
	return roundTrip(req)
}

func do(t *testing.T, req *nethttp.Request) reply {
	t.Helper()
	return check(t, roundTrip(req))
}

func roundTrip(req *nethttp.Request) reply {
	resp, err := client.Do(req)
	if err != nil {
		return reply{err: fmt.Errorf("%s %s: %w", req.Method, req.URL, err)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{err: fmt.Errorf("%s %s: reading the body: %w", req.Method, req.URL, err)}
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// check fails t if r carries an error.
func check(t *testing.T, r reply) reply {
	t.Helper()
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r
}

// recv returns the next reply sent on ch, within requesttest.WaitTimeout.
func recv(t *testing.T, ch <-chan reply) reply {
	t.Helper()
	return check(t, requesttest.Recv(t, ch, "a reply"))
}

func quoted(key string) string { return `"` + key + `"` }

// orders is a handler that counts its runs and creates order n.
type orders struct{ runs atomic.Int64 }

func (o *orders) ServeHTTP(w nethttp.ResponseWriter, r *nethttp.Request) {
	n := o.runs.Add(1)
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
	w.Header().Set("Set-Cookie", "session=abc")
	w.Header().Set("X-RateLimit-Remaining", "41")
	w.WriteHeader(nethttp.StatusCreated)
	fmt.Fprintf(w, `{"order":%d,"request":%s}`, n, body)
}

func problemType(t *testing.T, r reply) string {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json; body %s", ct, r.body)
	}
	var p struct {
		Type   string
		Status int
	}
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	if p.Status != r.status {
		t.Fatalf("problem status %d, response %d", p.Status, r.status)
	}
	return p.Type
}

// TestConcurrentIdenticalRequests: 50 identical requests at once run the
// handler once; while it runs the others get 409 with Retry-After, and
// afterwards every retry gets the first response, marked as a replay.
func TestConcurrentIdenticalRequests(t *testing.T) {
	forEachStore(t, func(t *testing.T, s request.Store) {
		var runs atomic.Int64
		gate := requesttest.NewGate(t)
		// 50 requests at once on a loaded machine can keep a store
		// (dynalite in particular) busy past the default timeout and
		// renewals; this test is about concurrency, not latency.
		srv := server(t, s, idemhttp.Config{Guard: patient}, func(w nethttp.ResponseWriter, r *nethttp.Request) {
			runs.Add(1)
			gate.Wait()
			w.Header().Set("Location", "/orders/1")
			w.WriteHeader(nethttp.StatusCreated)
			_, _ = io.WriteString(w, `{"order":1}`)
		})
		key := quoted(uuid.NewString())
		replies := make(chan reply, 50)
		for range 50 {
			go func() { replies <- send(srv.URL, key, `{"sku":"a"}`) }()
		}
		for range 49 {
			r := recv(t, replies)
			if r.status != nethttp.StatusConflict || r.header.Get("Retry-After") == "" || problemType(t, r) != idemhttp.ProblemInFlight {
				t.Fatalf("a concurrent duplicate got %d %v %s, want 409 in flight with Retry-After", r.status, r.header, r.body)
			}
		}
		gate.Open()
		first := recv(t, replies)
		if first.status != nethttp.StatusCreated || first.replayed() || first.header.Get(idemhttp.HeaderExpires) == "" {
			t.Fatalf("first = %+v, want 201 not replayed, with %s", first, idemhttp.HeaderExpires)
		}
		for range 5 {
			r := post(t, srv.URL, key, `{"sku":"a"}`)
			if r.status != first.status || r.body != first.body || !r.replayed() || r.header.Get("Location") != "/orders/1" {
				t.Fatalf("retry = %+v, want the first response replayed", r)
			}
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("handler ran %d times, want 1", n)
		}
	})
}

// TestWaitForInFlight: with Guard.Wait, duplicates wait for the first
// request and get its response instead of a 409.
func TestWaitForInFlight(t *testing.T) {
	forEachStore(t, func(t *testing.T, s request.Store) {
		o := &orders{}
		var runs atomic.Int64
		gate := requesttest.NewGate(t)
		wait := patient
		wait.Wait = time.Minute
		srv := server(t, s, idemhttp.Config{Guard: wait}, func(w nethttp.ResponseWriter, r *nethttp.Request) {
			runs.Add(1)
			gate.Wait()
			o.ServeHTTP(w, r)
		})
		key := quoted(uuid.NewString())
		replies := make(chan reply, 20)
		go func() { replies <- send(srv.URL, key, `{"sku":"a"}`) }()
		waitStarted(t, &runs, replies)
		for range 19 {
			go func() { replies <- send(srv.URL, key, `{"sku":"a"}`) }()
		}
		time.Sleep(50 * time.Millisecond) // let the duplicates reach their wait
		gate.Open()
		var bodies = map[string]int{}
		replays := 0
		for range 20 {
			r := recv(t, replies)
			if r.status != nethttp.StatusCreated {
				t.Fatalf("got %d %s, want 201", r.status, r.body)
			}
			bodies[r.body]++
			if r.replayed() {
				replays++
			}
		}
		if len(bodies) != 1 || replays != 19 || o.runs.Load() != 1 {
			t.Fatalf("bodies %v, %d replays, %d runs; want one body, 19 replays, 1 run", bodies, replays, o.runs.Load())
		}
	})
}

// TestReusedKeyOtherRequest: the same key with another body is a 422 and
// the handler does not run; the same JSON reformatted is the same request.
func TestReusedKeyOtherRequest(t *testing.T) {
	forEachStore(t, func(t *testing.T, s request.Store) {
		o := &orders{}
		srv := server(t, s, idemhttp.Config{}, o.ServeHTTP)
		key := quoted(uuid.NewString())
		first := post(t, srv.URL, key, `{"sku":"a","qty":1}`)
		if first.status != nethttp.StatusCreated {
			t.Fatalf("first: %+v", first)
		}
		r := post(t, srv.URL, key, `{"sku":"b","qty":1}`)
		if r.status != nethttp.StatusUnprocessableEntity || problemType(t, r) != idemhttp.ProblemKeyReused {
			t.Fatalf("reused key with another body: %d %s, want 422 %s", r.status, r.body, idemhttp.ProblemKeyReused)
		}
		if r := post(t, srv.URL, key, "{ \"qty\": 1, \"sku\": \"a\" }"); r.status != nethttp.StatusCreated || !r.replayed() || r.body != first.body {
			t.Fatalf("same JSON, other key order and spacing: %+v, want the replay", r)
		}
		req, _ := nethttp.NewRequest(nethttp.MethodPatch, srv.URL+"/orders", strings.NewReader(`{"sku":"a","qty":1}`))
		req.Header.Set(idemhttp.HeaderKey, key)
		req.Header.Set("Content-Type", "application/json")
		if r := do(t, req); r.status != nethttp.StatusUnprocessableEntity {
			t.Fatalf("same key and body, other method: %d, want 422", r.status)
		}
		if n := o.runs.Load(); n != 1 {
			t.Fatalf("handler ran %d times, want 1", n)
		}
	})
}

// TestBadKeys: a missing or malformed key is a 400 and the handler does
// not run.
func TestBadKeys(t *testing.T) {
	s := requesttest.OpenPostgres(t)
	o := &orders{}
	lenient := server(t, s, idemhttp.Config{}, o.ServeHTTP)
	strict := server(t, s, idemhttp.Config{Strict: true}, o.ServeHTTP)
	uuids := server(t, s, idemhttp.Config{Guard: request.Config{Keys: request.KeyRules{Format: request.UUIDKey}}}, o.ServeHTTP)
	for _, tc := range []struct {
		name   string
		srv    *httptest.Server
		header []string
		want   string
	}{
		{"missing", lenient, nil, idemhttp.ProblemKeyMissing},
		{"empty string", lenient, []string{`""`}, idemhttp.ProblemKeyMalformed},
		{"two lines", lenient, []string{`"a"`, `"b"`}, idemhttp.ProblemKeyMalformed},
		{"unterminated", lenient, []string{`"abc`}, idemhttp.ProblemKeyMalformed},
		{"after quote", lenient, []string{`"abc";x`}, idemhttp.ProblemKeyMalformed},
		{"bad escape", lenient, []string{`"a\b"`}, idemhttp.ProblemKeyMalformed},
		{"list", lenient, []string{`a, b`}, idemhttp.ProblemKeyMalformed},
		{"too long", lenient, []string{quoted(strings.Repeat("k", 256))}, idemhttp.ProblemKeyMalformed},
		{"bare in strict mode", strict, []string{"abc"}, idemhttp.ProblemKeyMalformed},
		{"not a UUID", uuids, []string{`"abc"`}, idemhttp.ProblemKeyMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := nethttp.NewRequest(nethttp.MethodPost, tc.srv.URL+"/orders", strings.NewReader("{}"))
			for _, v := range tc.header {
				req.Header.Add(idemhttp.HeaderKey, v)
			}
			r := do(t, req)
			if r.status != nethttp.StatusBadRequest || problemType(t, r) != tc.want {
				t.Fatalf("got %d %s, want 400 %s", r.status, r.body, tc.want)
			}
		})
	}
	for _, good := range []struct {
		srv *httptest.Server
		key string
	}{
		{lenient, "bare-key_1.2~3"},
		{lenient, quoted(strings.Repeat("k", 255))},
		{lenient, `"with \"quotes\" and \\ and spaces"`},
		{strict, quoted("strict-ok")},
		{uuids, quoted(uuid.NewString())},
	} {
		if r := post(t, good.srv.URL, good.key, "{}"); r.status != nethttp.StatusCreated {
			t.Fatalf("key %s: %d %s, want 201", good.key, r.status, r.body)
		}
	}
	if n := o.runs.Load(); n != 5 {
		t.Fatalf("handler ran %d times, want 5 (the good keys only)", n)
	}
}

// TestFailuresReleaseTheKey: a panic, a 5xx and a 429 hand the key back,
// and the retry runs the handler once more and is stored.
func TestFailuresReleaseTheKey(t *testing.T) {
	forEachStore(t, func(t *testing.T, s request.Store) {
		for _, failure := range []string{"panic", "500", "429"} {
			t.Run(failure, func(t *testing.T) {
				var runs atomic.Int64
				srv := server(t, s, idemhttp.Config{}, func(w nethttp.ResponseWriter, r *nethttp.Request) {
					if runs.Add(1) == 1 {
						switch failure {
						case "panic":
							panic("handler bug")
						case "500":
							nethttp.Error(w, "database down", nethttp.StatusInternalServerError)
						case "429":
							nethttp.Error(w, "slow down", nethttp.StatusTooManyRequests)
						}
						return
					}
					w.WriteHeader(nethttp.StatusCreated)
					_, _ = io.WriteString(w, "created")
				})
				srv.Config.ErrorLog = quietLog()
				key := quoted(uuid.NewString())
				req, _ := nethttp.NewRequest(nethttp.MethodPost, srv.URL+"/orders", strings.NewReader("{}"))
				req.Header.Set(idemhttp.HeaderKey, key)
				req.Header.Set("Content-Type", "application/json")
				if resp, err := client.Do(req); err == nil {
					_ = resp.Body.Close()
					if resp.StatusCode < 400 || resp.Header.Get(idemhttp.HeaderExpires) != "" {
						t.Fatalf("failed attempt answered %d %v", resp.StatusCode, resp.Header)
					}
				}
				for i := range 3 {
					r := post(t, srv.URL, key, "{}")
					if r.status != nethttp.StatusCreated || r.body != "created" || r.replayed() != (i > 0) {
						t.Fatalf("retry %d: %+v, want 201 created (replayed after the first)", i, r)
					}
				}
				if n := runs.Load(); n != 2 {
					t.Fatalf("handler ran %d times, want 2 (the failure and one retry)", n)
				}
			})
		}
	})
}

// TestStalledHolderIsFenced: a holder that stalls past its lease (its
// deadline passed, so renewal stopped) is taken over by a retry; its late
// completion is refused and the retry's response stands.
func TestStalledHolderIsFenced(t *testing.T) {
	forEachStore(t, func(t *testing.T, s request.Store) {
		var runs atomic.Int64
		stall := requesttest.NewGate(t)
		// Timeout bounds the claim too: generous, so a loaded store is not a 503.
		cfg := idemhttp.Config{Guard: request.Config{Lease: 300 * time.Millisecond}, Timeout: time.Second, Final: idemhttp.FinalAll}
		srv := server(t, s, cfg, func(w nethttp.ResponseWriter, r *nethttp.Request) {
			n := runs.Add(1)
			if n == 1 {
				stall.Wait() // ignores its context, as stuck code does
			}
			w.WriteHeader(nethttp.StatusCreated)
			fmt.Fprintf(w, "attempt %d", n)
		})
		key := quoted(uuid.NewString())
		firstReply := make(chan reply, 1)
		go func() { firstReply <- send(srv.URL, key, "{}") }()
		waitStarted(t, &runs, firstReply)
		second := retryUntilDone(t, srv.URL, key)
		if second.status != nethttp.StatusCreated || second.body != "attempt 2" || second.replayed() {
			t.Fatalf("takeover = %+v, want 201 attempt 2", second)
		}
		stall.Open()
		first := recv(t, firstReply)
		if first.body != "attempt 2" || !first.replayed() {
			t.Fatalf("the stalled holder's client got %+v, want the successor's response replayed", first)
		}
		if r := post(t, srv.URL, key, "{}"); r.body != "attempt 2" || !r.replayed() {
			t.Fatalf("later retry got %+v, want attempt 2", r)
		}
		if n := runs.Load(); n != 2 {
			t.Fatalf("handler ran %d times, want 2", n)
		}
	})
}

// TestReplayedHeaders: only allow-listed headers are stored; Set-Cookie
// and rate-limit headers are not replayed, and cannot be configured to be.
func TestReplayedHeaders(t *testing.T) {
	s := requesttest.OpenPostgres(t)
	o := &orders{}
	srv := server(t, s, idemhttp.Config{}, o.ServeHTTP)
	key := quoted(uuid.NewString())
	first := post(t, srv.URL, key, "{}")
	if first.header.Get("Set-Cookie") == "" {
		t.Fatal("the first response lost its own Set-Cookie")
	}
	r := post(t, srv.URL, key, "{}")
	if !r.replayed() || r.header.Get("Location") != "/orders/1" || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("replay headers %v", r.header)
	}
	if r.header.Get("Set-Cookie") != "" || r.header.Get("X-RateLimit-Remaining") != "" {
		t.Fatalf("replay carried one-response headers: %v", r.header)
	}
	exp, err := nethttp.ParseTime(r.header.Get(idemhttp.HeaderExpires))
	if err != nil || exp.Before(time.Now().Add(23*time.Hour)) {
		t.Fatalf("%s = %q (%v), want about 24h from now", idemhttp.HeaderExpires, r.header.Get(idemhttp.HeaderExpires), err)
	}
	for _, h := range []string{"Set-Cookie", "date", "X-RateLimit-Limit", "RateLimit-Policy"} {
		if _, err := idemhttp.New(s, idemhttp.Config{ReplayHeaders: []string{h}}); err == nil {
			t.Fatalf("ReplayHeaders %s accepted", h)
		}
	}
}

// TestUnprotected: GET and other unprotected methods pass through without
// a key; with Optional, a keyless POST runs unprotected; Protect chooses
// per route.
func TestUnprotected(t *testing.T) {
	s := requesttest.OpenPostgres(t)
	o := &orders{}
	srv := server(t, s, idemhttp.Config{}, o.ServeHTTP)
	optional := server(t, s, idemhttp.Config{Optional: true}, o.ServeHTTP)
	req, _ := nethttp.NewRequest(nethttp.MethodGet, srv.URL+"/orders", nil)
	if r := do(t, req); r.status != nethttp.StatusCreated {
		t.Fatalf("GET without a key: %d", r.status)
	}
	for range 2 {
		if r := post(t, optional.URL, "", "{}"); r.status != nethttp.StatusCreated || r.replayed() {
			t.Fatalf("optional POST without a key: %+v", r)
		}
	}
	// Per-route choice: everything but /health is protected, GET included.
	routes := server(t, s, idemhttp.Config{Protect: func(r *nethttp.Request) bool { return r.URL.Path != "/health" }}, o.ServeHTTP)
	health, _ := nethttp.NewRequest(nethttp.MethodPost, routes.URL+"/health", nil)
	if r := do(t, health); r.status != nethttp.StatusCreated {
		t.Fatalf("POST /health without a key: %d", r.status)
	}
	get, _ := nethttp.NewRequest(nethttp.MethodGet, routes.URL+"/orders", nil)
	if r := do(t, get); r.status != nethttp.StatusBadRequest {
		t.Fatalf("protected GET without a key: %d, want 400", r.status)
	}
	if n := o.runs.Load(); n != 4 {
		t.Fatalf("handler ran %d times, want 4", n)
	}
}

// TestOversizedResponse: a response over MaxResponse is sent in full, and a
// retry gets a 410 that says its body was not kept (with the original
// status and Location), never an empty body passed off as the original.
// Raised, MaxResponse lets the Postgres store replay a 5 MiB body in full.
func TestOversizedResponse(t *testing.T) {
	s := requesttest.OpenPostgres(t)
	for _, tc := range []struct {
		name        string
		maxResponse int
		size        int
	}{
		{"over MaxResponse", 1000, 10_000},
		{"kept by Postgres", 8 << 20, 5 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			big := strings.Repeat("x", tc.size)
			var runs atomic.Int64
			srv := server(t, s, idemhttp.Config{MaxResponse: tc.maxResponse}, func(w nethttp.ResponseWriter, r *nethttp.Request) {
				runs.Add(1)
				w.Header().Set("Location", "/reports/1")
				w.WriteHeader(nethttp.StatusCreated)
				for i := 0; i < len(big); i += 1000 {
					_, _ = io.WriteString(w, big[i:min(i+1000, len(big))])
				}
			})
			key := quoted(uuid.NewString())
			if r := post(t, srv.URL, key, "{}"); r.status != nethttp.StatusCreated || r.body != big {
				t.Fatalf("first: %d, %d bytes", r.status, len(r.body))
			}
			r := post(t, srv.URL, key, "{}")
			if tc.size > tc.maxResponse {
				checkNotKept(t, r)
			} else if r.status != nethttp.StatusCreated || !r.replayed() || r.body != big {
				t.Fatalf("replay: %d %v, %d bytes; want the original %d bytes", r.status, r.header, len(r.body), len(big))
			}
			if runs.Load() != 1 {
				t.Fatalf("handler ran %d times", runs.Load())
			}
		})
	}
}

// quietLog silences the server's log of the panics the tests provoke.
func quietLog() *log.Logger { return log.New(io.Discard, "", 0) }

// TestHooks: OnResult reports what happened to every protected request.
func TestHooks(t *testing.T) {
	s := requesttest.OpenPostgres(t)
	var mu sync.Mutex
	var got []idemhttp.ResultEvent
	cfg := idemhttp.Config{Scope: func(r *nethttp.Request) string { return r.Header.Get("X-Tenant") },
		Hooks: idemhttp.Hooks{OnResult: func(ev idemhttp.ResultEvent) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, ev)
		}}}
	var runs atomic.Int64
	srv := server(t, s, cfg, func(w nethttp.ResponseWriter, r *nethttp.Request) {
		if runs.Add(1) == 1 {
			w.WriteHeader(nethttp.StatusBadGateway)
			return
		}
		w.WriteHeader(nethttp.StatusCreated)
	})
	key := quoted(uuid.NewString())
	post(t, srv.URL, "", "{}")
	post(t, srv.URL, key, "{}")
	post(t, srv.URL, key, "{}")
	post(t, srv.URL, key, "{}")
	post(t, srv.URL, key, `{"other":1}`)
	want := []struct {
		result request.Result
		status int
	}{
		{request.ResultRejected, 400}, {request.ResultReleased, 502}, {request.ResultCompleted, 201},
		{request.ResultReplayed, 201}, {request.ResultConflict, 422},
	}
	if len(got) != len(want) {
		t.Fatalf("%d events, want %d", len(got), len(want))
	}
	for i, w := range want {
		ev := got[i]
		if ev.Result != w.result || ev.Status != w.status || ev.Request == nil {
			t.Errorf("event %d: %v %d, want %v %d", i, ev.Result, ev.Status, w.result, w.status)
		}
		if i > 0 && ev.ID.Key != key[1:len(key)-1] {
			t.Errorf("event %d: key %q", i, ev.ID.Key)
		}
		if (ev.Result == request.ResultCompleted || ev.Result == request.ResultReleased) && ev.Token <= 0 {
			t.Errorf("event %d: token %d", i, ev.Token)
		}
	}
	if got[0].Err == nil || got[4].Err == nil {
		t.Error("Rejected and Conflict events carry no error")
	}
}

// TestScopes: the same key from two tenants is two requests; neither
// sees the other's response.
func TestScopes(t *testing.T) {
	s := requesttest.OpenPostgres(t)
	o := &orders{}
	srv := server(t, s, idemhttp.Config{Scope: func(r *nethttp.Request) string { return r.Header.Get("X-Tenant") }}, o.ServeHTTP)
	key := quoted(uuid.NewString())
	send := func(tenant string) reply {
		req, _ := nethttp.NewRequest(nethttp.MethodPost, srv.URL+"/orders", strings.NewReader("{}"))
		req.Header.Set(idemhttp.HeaderKey, key)
		req.Header.Set("X-Tenant", tenant)
		return do(t, req)
	}
	a, b := send("a"), send("b")
	if a.replayed() || b.replayed() || a.body == b.body || o.runs.Load() != 2 {
		t.Fatalf("tenant a got %q, tenant b got %q, %d runs; want two separate orders", a.body, b.body, o.runs.Load())
	}
	if again := send("a"); !again.replayed() || again.body != a.body {
		t.Fatalf("tenant a's retry got %+v", again)
	}
}

// waitStarted waits until a handler ran, or fails if the request that
// should run it was answered first (a store error under load).
func waitStarted(t *testing.T, runs *atomic.Int64, reply chan reply) {
	t.Helper()
	deadline := time.After(requesttest.WaitTimeout)
	for runs.Load() == 0 {
		select {
		case r := <-reply:
			t.Fatalf("the first request did not reach the handler: %+v", r)
		case <-deadline:
			t.Fatal("gave up waiting for the first request to reach the handler")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// retryUntilDone retries key (a header value) as a client does while the
// answer says to retry with the same key (409: the request in flight has
// not ended or lost its lease yet; 503: the store is busy), and returns
// the first other reply.
func retryUntilDone(t *testing.T, url, key string) reply {
	t.Helper()
	for deadline := time.Now().Add(requesttest.WaitTimeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if r := post(t, url, key, "{}"); r.status != nethttp.StatusConflict && r.status != nethttp.StatusServiceUnavailable {
			return r
		}
	}
	t.Fatalf("key %s still in flight after %v", key, requesttest.WaitTimeout)
	return reply{}
}
