package idemhttp_test

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	nethttp "net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/dynamostore"
	"github.com/idemq/idemq/request/idemhttp"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/request/requesttest"
	"github.com/idemq/idemq/testenv"
)

// TestBadInputTypedNilStore: a typed-nil store is refused by New with an
// idemq.ErrConfig error, instead of a panic on every request.
func TestBadInputTypedNilStore(t *testing.T) {
	for _, s := range []request.Store{nil, (*pgstore.Store)(nil), (*dynamostore.Store)(nil)} {
		if _, err := idemhttp.New(s, idemhttp.Config{}); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("New(%T(nil)) = %v, want ErrConfig", s, err)
		}
	}
}

// syncBuffer is a log destination the server's goroutines write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestBadInputServerMisconfigured: a Scope that returns non-ASCII or more
// than 128 bytes, and a Fingerprint that returns 65 bytes for some
// request, are the server's fault: a 500 (ProblemMisconfigured) with the
// reason logged, the handler not run; never a 400 or a 503.
func TestBadInputServerMisconfigured(t *testing.T) {
	s := requesttest.OpenPostgres(t)
	var logs syncBuffer
	o := &orders{}
	srv := server(t, s, idemhttp.Config{
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Scope:  func(r *nethttp.Request) string { return r.Header.Get("X-Tenant") },
		Fingerprint: func(r *nethttp.Request, body []byte) []byte {
			if bytes.Contains(body, []byte("wide")) {
				return make([]byte, 65)
			}
			return idemhttp.FingerprintDefault(r, body)
		},
	}, o.ServeHTTP)
	for name, tc := range map[string]struct{ tenant, body, logged string }{
		"non-ASCII scope": {"tenant-ü", "{}", "not printable ASCII"},
		"long scope":      {strings.Repeat("t", 129), "{}", "over the limit of 128"},
		"65-byte digest":  {"t1", `{"wide":1}`, "returned 65 bytes"},
	} {
		req, _ := nethttp.NewRequest(nethttp.MethodPost, srv.URL+"/orders", strings.NewReader(tc.body))
		req.Header.Set(idemhttp.HeaderKey, quoted(uuid.NewString()))
		req.Header.Set("X-Tenant", tc.tenant)
		r := do(t, req)
		if r.status != nethttp.StatusInternalServerError || problemType(t, r) != idemhttp.ProblemMisconfigured {
			t.Errorf("%s: %d %s, want 500 %s", name, r.status, r.body, idemhttp.ProblemMisconfigured)
		}
		if !strings.Contains(logs.String(), tc.logged) {
			t.Errorf("%s: the log does not say %q:\n%s", name, tc.logged, logs.String())
		}
	}
	if n := o.runs.Load(); n != 0 {
		t.Fatalf("the handler ran %d times", n)
	}
	wide := func(*nethttp.Request, []byte) []byte { return make([]byte, 65) }
	if _, err := idemhttp.New(s, idemhttp.Config{Fingerprint: wide}); !errors.Is(err, idemq.ErrConfig) || !strings.Contains(err.Error(), "Fingerprint") {
		t.Fatalf("New with a 65-byte Fingerprint = %v, want an ErrConfig naming Fingerprint", err)
	}
}

// TestBadInputMaxResponseOverStoreLimit: a MaxResponse the store cannot
// keep (DynamoDB's item limit) is refused at startup.
func TestBadInputMaxResponseOverStoreLimit(t *testing.T) {
	db, table := testenv.DynamoDB(t)
	s, err := dynamostore.New(db, dynamostore.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idemhttp.New(s, idemhttp.Config{MaxResponse: 1 << 20}); !errors.Is(err, idemq.ErrConfig) || !strings.Contains(err.Error(), "MaxResponse") {
		t.Fatalf("MaxResponse of 1 MiB on DynamoDB = %v, want an ErrConfig naming MaxResponse", err)
	}
	if _, err := idemhttp.New(s, idemhttp.Config{}); err != nil {
		t.Fatalf("the default MaxResponse on DynamoDB: %v", err)
	}
}

// TestProblemTypesResolve: every problem type links to a section of
// problems.md that exists.
func TestProblemTypesResolve(t *testing.T) {
	doc, err := os.ReadFile("problems.md")
	if err != nil {
		t.Fatal(err)
	}
	const base = "https://github.com/idemq/idemq/blob/main/request/idemhttp/problems.md#"
	for _, typ := range []string{idemhttp.ProblemKeyMissing, idemhttp.ProblemKeyMalformed, idemhttp.ProblemKeyReused,
		idemhttp.ProblemInFlight, idemhttp.ProblemUnavailable, idemhttp.ProblemNotCommitted, idemhttp.ProblemBodyTooLarge,
		idemhttp.ProblemMisconfigured, idemhttp.ProblemResponseNotKept} {
		anchor, ok := strings.CutPrefix(typ, base)
		if !ok || !bytes.Contains(doc, []byte("\n## "+anchor+"\n")) {
			t.Errorf("problem type %s has no section in problems.md", typ)
		}
	}
}

// TestBadInputOversizedResponseOnDynamo: a response over what a DynamoDB item
// holds is sent in full, and a retry gets a 410 saying its body was not
// kept, with the original status and Location; the handler runs once.
func TestBadInputOversizedResponseOnDynamo(t *testing.T) {
	db, table := testenv.DynamoDB(t)
	s := requesttest.Dynamo(t, db, table)
	big := strings.Repeat("x", dynamostore.MaxResponse-10)
	var runs atomic.Int64
	// MaxResponse is the store's limit; the headers push it over.
	srv := server(t, s, idemhttp.Config{}, func(w nethttp.ResponseWriter, r *nethttp.Request) {
		runs.Add(1)
		w.Header().Set("Location", "/reports/1")
		w.WriteHeader(nethttp.StatusCreated)
		_, _ = io.WriteString(w, big)
	})
	key := quoted(uuid.NewString())
	if r := post(t, srv.URL, key, "{}"); r.status != nethttp.StatusCreated || r.body != big {
		t.Fatalf("first: %d, %d bytes", r.status, len(r.body))
	}
	checkNotKept(t, post(t, srv.URL, key, "{}"))
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times", runs.Load())
	}
}

// checkNotKept checks a replay of a 201 whose body was not kept.
func checkNotKept(t *testing.T, r reply) {
	t.Helper()
	if r.status != nethttp.StatusGone || !r.replayed() || problemType(t, r) != idemhttp.ProblemResponseNotKept ||
		r.header.Get("Location") != "/reports/1" || !strings.Contains(r.body, `"original_status":201`) {
		t.Fatalf("replay: %d %v %s, want 410 %s with the original status and Location", r.status, r.header, r.body, idemhttp.ProblemResponseNotKept)
	}
}
