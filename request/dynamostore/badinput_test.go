package dynamostore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/dynamostore"
	"github.com/idemq/idemq/testenv"
)

// TestBadInputTableNames: names DynamoDB refuses are refused by New, with
// an error that says what a name may hold.
func TestBadInputTableNames(t *testing.T) {
	db := testenv.DynamoDBClient("http://127.0.0.1:1") // never reached
	for _, name := range []string{"ab", strings.Repeat("t", 256), "orders table", "orders/requests", "tëst_requests", "req:1"} {
		_, err := dynamostore.New(db, dynamostore.Config{Table: name})
		var ce *idemq.ConfigError
		if !errors.As(err, &ce) || ce.Field != "Table" || !strings.Contains(err.Error(), "a-z") {
			t.Errorf("Table %q: %v, want a ConfigError on Table that lists the allowed characters", name, err)
		}
	}
	for _, name := range []string{"abc", "idemq.requests-v2_1", strings.Repeat("t", 255)} {
		if _, err := dynamostore.New(db, dynamostore.Config{Table: name}); err != nil {
			t.Errorf("Table %q: %v", name, err)
		}
	}
}

// TestBadInputTableWithOtherKey: an existing table with another key
// schema is refused by CreateTable at start with an ErrConfig that names
// the key it found; a claim on such a table (CreateTable skipped) is
// ErrMisconfigured, never a store outage answered with 503 forever.
func TestBadInputTableWithOtherKey(t *testing.T) {
	t.Parallel()
	db, table := testenv.DynamoDB(t)
	ctx := context.Background()
	if _, err := db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	}); err != nil {
		t.Fatal(err)
	}
	s, err := dynamostore.New(db, dynamostore.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateTable(ctx); !errors.Is(err, idemq.ErrConfig) || !strings.Contains(err.Error(), "id HASH") {
		t.Fatalf("CreateTable on a table keyed by id: %v, want an ErrConfig naming its key", err)
	}
	_, err = s.Claim(ctx, request.ID{Key: "k"}, []byte("fp"), 0)
	if !errors.Is(err, request.ErrMisconfigured) {
		t.Fatalf("Claim on a table keyed by id: %v, want ErrMisconfigured", err)
	}
}
