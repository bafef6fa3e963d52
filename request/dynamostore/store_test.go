package dynamostore_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/dynamostore"
	"github.com/idemq/idemq/request/requesttest"
	"github.com/idemq/idemq/testenv"
)

func TestConformance(t *testing.T) {
	requesttest.Run(t, requesttest.Harness{
		New: func(t *testing.T, ttl time.Duration) request.Store {
			db, table := testenv.DynamoDB(t)
			s, err := dynamostore.New(db, dynamostore.Config{Table: table, RecordTTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.CreateTable(context.Background()); err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}
