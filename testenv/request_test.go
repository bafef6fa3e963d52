package testenv_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idemq/idemq/testenv"
)

func TestProxyRefusesWhileStopped(t *testing.T) {
	t.Parallel()
	rdb, _ := testenv.Redis(t)
	p := testenv.NewProxy(t, rdb.Options().Addr)
	dial := func() error {
		c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err
	}
	if err := dial(); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	if err := dial(); err == nil {
		t.Fatal("the stopped proxy accepted a connection")
	}
	p.Start()
	if err := dial(); err != nil {
		t.Fatalf("after Start: %v", err)
	}
}

func TestRedisServerRestarts(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	rdb := srv.Client()
	ctx := context.Background()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	if err := rdb.Ping(ctx).Err(); err == nil {
		t.Fatal("ping of a stopped server succeeded")
	}
	srv.Start()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("after Start: %v", err)
	}
}

// TestDynaliteKeepsDataAcrossRestart: an outage test's server comes back
// with its tables and items.
func TestDynaliteKeepsDataAcrossRestart(t *testing.T) {
	t.Parallel()
	d := testenv.StartDynalite(t)
	db := d.Client()
	ctx := context.Background()
	table := aws.String("items")
	_, err := db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            table,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("pk"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("pk"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatal(err)
	}
	// A new table is CREATING for a moment even with --createTableMs 0.
	exists := dynamodb.NewTableExistsWaiter(db, func(o *dynamodb.TableExistsWaiterOptions) { o.MinDelay = 20 * time.Millisecond })
	if err := exists.Wait(ctx, &dynamodb.DescribeTableInput{TableName: table}, time.Minute); err != nil {
		t.Fatal(err)
	}
	item := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "a"}}
	if _, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: table, Item: item}); err != nil {
		t.Fatal(err)
	}
	d.Stop()
	if _, err := db.GetItem(ctx, &dynamodb.GetItemInput{TableName: table, Key: item}); err == nil {
		t.Fatal("GetItem on a stopped server succeeded")
	}
	d.Start()
	out, err := db.GetItem(ctx, &dynamodb.GetItemInput{TableName: table, Key: item, ConsistentRead: aws.Bool(true)})
	if err != nil || out.Item == nil {
		t.Fatalf("after Start: %v, %v", out, err)
	}
}
