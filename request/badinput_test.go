package request_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/dynamostore"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/request/redisstore"
)

// TestBadInputServerValues: a scope or fingerprint the server derived and
// the store cannot take is ErrMisconfigured (the front ends' 500), never
// ErrInvalidKey (the client's 400) or an ErrUnavailable (503 forever).
func TestBadInputServerValues(t *testing.T) {
	t.Parallel()
	g := guard(t, redisStore(t), request.Config{})
	for name, tc := range map[string]struct {
		id request.ID
		fp []byte
	}{
		"long scope":        {request.ID{Scope: strings.Repeat("s", request.MaxScopeLen+1), Key: "k"}, fp},
		"non-ASCII scope":   {request.ID{Scope: "tenant-ü", Key: "k"}, fp},
		"65-byte digest":    {newID(), make([]byte, 65)},
		"both, bad key too": {request.ID{Scope: "ü", Key: ""}, fp},
	} {
		_, err := g.Begin(context.Background(), tc.id, tc.fp)
		if !errors.Is(err, request.ErrMisconfigured) || errors.Is(err, request.ErrInvalidKey) || errors.Is(err, request.ErrUnavailable) {
			t.Errorf("%s: Begin = %v, want ErrMisconfigured only", name, err)
		}
	}
}

// TestBadInputTypedNil: every constructor that takes an interface refuses
// a typed nil with an idemq.ErrConfig error instead of panicking later.
func TestBadInputTypedNil(t *testing.T) {
	if _, err := request.New((*pgstore.Store)(nil), request.Config{}); !errors.Is(err, idemq.ErrConfig) || !strings.Contains(err.Error(), "Store") {
		t.Errorf("request.New((*pgstore.Store)(nil)) = %v, want an ErrConfig naming Store", err)
	}
	if _, err := pgstore.New((*pgxpool.Pool)(nil), pgstore.Config{}); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("pgstore.New(nil pool) = %v, want ErrConfig", err)
	}
	if _, err := redisstore.New(context.Background(), (*redis.Client)(nil), redisstore.Config{}); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("redisstore.New(nil client) = %v, want ErrConfig", err)
	}
	if _, err := dynamostore.New((*dynamodb.Client)(nil), dynamostore.Config{}); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("dynamostore.New(nil client) = %v, want ErrConfig", err)
	}
}
