package dynamostore_test

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idemq/idemq/request/dynamostore"
	"github.com/idemq/idemq/request/requesttest"
	"github.com/idemq/idemq/testenv"
)

// BenchmarkRecordSize reports the size DynamoDB bills per completed record
// (see requesttest.Fill): attribute names plus values by DynamoDB's item
// size rules, averaged over 2 000 items. dynalite keeps no table size, so
// the items are measured one by one.
func BenchmarkRecordSize(b *testing.B) {
	const n = 2_000
	db, table := testenv.DynamoDB(b)
	ctx := context.Background()
	s, err := dynamostore.New(db, dynamostore.Config{Table: table})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.CreateTable(ctx); err != nil {
		b.Fatal(err)
	}
	requesttest.Fill(b, s, n)
	var total, items int
	pages := dynamodb.NewScanPaginator(db, &dynamodb.ScanInput{TableName: aws.String(table)})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for _, item := range page.Items {
			total += itemSize(item)
			items++
		}
	}
	if items != n {
		b.Fatalf("scanned %d items, want %d", items, n)
	}
	for b.Loop() {
	}
	b.ReportMetric(float64(total)/float64(items), "B/record")
}

// itemSize follows DynamoDB's rules: each attribute costs its name's bytes
// plus its value's (strings and binaries their length, numbers about one
// byte per two significant digits plus one).
func itemSize(item map[string]types.AttributeValue) int {
	size := 0
	for name, v := range item {
		size += len(name)
		switch v := v.(type) {
		case *types.AttributeValueMemberS:
			size += len(v.Value)
		case *types.AttributeValueMemberB:
			size += len(v.Value)
		case *types.AttributeValueMemberN:
			size += (len(v.Value)+1)/2 + 1
		}
	}
	return size
}
