// Package dynamostore keeps request records in DynamoDB (aws-sdk-go-v2):
// a durable store for services that run on AWS without Postgres.
//
// # Layout
//
// One item per key in one table whose partition key is "pk" (a string:
// the scope's length, the scope and the key). Short attribute names keep
// items small, since DynamoDB bills names by the byte:
//
//	f  B  fingerprint          s  N  state (1 in progress, 2 completed, 3 released)
//	t  N  fencing token        lu N  lease end, Unix milliseconds
//	r  B  response             ex N  expiry, Unix seconds (the table's TTL attribute)
//
// Every operation is one conditional write: a claim is an UpdateItem that
// succeeds only if the item is missing, expired, released, or in progress
// under a lease that ran out, with the same fingerprint; Complete, Release
// and Extend require state 1 and the caller's token.
//
// # Time and expiry
//
// DynamoDB has no server clock for conditions, so leases and expiry are
// judged by the clients' clocks: keep them in sync (NTP), and keep leases
// far above the skew. DynamoDB's TTL deletes expired items lazily (within
// days), so every read and claim treats an item whose ex has passed as
// absent. A new item's token starts at the client's clock in microseconds
// rather than at one, so that tokens keep growing after TTL deleted an
// item.
package dynamostore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/nilcheck"
	"github.com/idemq/idemq/request"
)

// API is the part of *dynamodb.Client the store uses.
type API interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	UpdateTimeToLive(ctx context.Context, in *dynamodb.UpdateTimeToLiveInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
}

// Config configures a Store. The zero value is valid.
type Config struct {
	// Table names the DynamoDB table. Defaults to "idemq_requests".
	Table string
	// RecordTTL is how long a record is kept after its last change.
	// Defaults to request.RecordTTLDefault (24 hours).
	RecordTTL time.Duration
}

// TableDefault is the default Config.Table.
const TableDefault = "idemq_requests"

const component = "dynamostore"

func (c Config) withDefaults() Config {
	c.Table = cmp.Or(c.Table, TableDefault)
	c.RecordTTL = cmp.Or(c.RecordTTL, request.RecordTTLDefault)
	return c
}

func (c Config) validate() error {
	switch {
	case len(c.Table) < 3 || len(c.Table) > 255 || strings.TrimLeft(c.Table, tableChars) != "":
		return idemq.NewConfigError(component, "Table", "%q is not a DynamoDB table name: use 3 to 255 characters of a-z, A-Z, 0-9, '_', '-' and '.'", c.Table)
	case c.RecordTTL < time.Second:
		return idemq.NewConfigError(component, "RecordTTL", "%v is below one second, the TTL attribute's unit", c.RecordTTL)
	}
	return nil
}

// tableChars are the characters DynamoDB allows in table names.
const tableChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-."

// Store is a [request.Store] on DynamoDB. It is safe for concurrent use.
type Store struct {
	db  API
	cfg Config
}

var _ request.Store = (*Store)(nil)

// New returns a Store on db; call [Store.CreateTable] once, or create the
// table as it describes.
func New(db API, cfg Config) (*Store, error) {
	if nilcheck.IsNil(db) {
		return nil, idemq.NewConfigError(component, "db", "is nil (%T); pass a *dynamodb.Client", db)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Store{db: db, cfg: cfg}, nil
}

// CreateTable creates the table (on-demand capacity, partition key "pk"),
// waits until it is active and enables TTL on "ex". A table that exists is
// kept if its key is the store's (partition key "pk" of type string, no
// sort key); one with another key schema is refused with an error
// matching idemq.ErrConfig, since every claim would fail on it. A server
// without the TTL API (dynalite) is accepted: reads ignore expired items
// anyway.
func (s *Store) CreateTable(ctx context.Context) error {
	_, err := s.db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            &s.cfg.Table,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("pk"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("pk"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if inUse := (*types.ResourceInUseException)(nil); err != nil && !errors.As(err, &inUse) {
		return fmt.Errorf("dynamostore: create table %s: %w", s.cfg.Table, err)
	}
	waiter := dynamodb.NewTableExistsWaiter(s.db, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay, o.MaxDelay = 100*time.Millisecond, 5*time.Second
	})
	out, err := waiter.WaitForOutput(ctx, &dynamodb.DescribeTableInput{TableName: &s.cfg.Table}, 2*time.Minute)
	if err != nil {
		return fmt.Errorf("dynamostore: wait for table %s: %w", s.cfg.Table, err)
	}
	if err := s.checkSchema(out.Table); err != nil {
		return err
	}
	_, err = s.db.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName:               &s.cfg.Table,
		TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String("ex"), Enabled: aws.Bool(true)},
	})
	if err != nil && !ttlUnsupported(err) {
		return fmt.Errorf("dynamostore: enable TTL on %s: %w", s.cfg.Table, err)
	}
	return nil
}

// checkSchema refuses a table whose key is not the store's: partition key
// "pk" of type S and no sort key.
func (s *Store) checkSchema(t *types.TableDescription) error {
	keyType := map[string]types.ScalarAttributeType{}
	for _, a := range t.AttributeDefinitions {
		keyType[aws.ToString(a.AttributeName)] = a.AttributeType
	}
	var keys []string
	for _, k := range t.KeySchema {
		keys = append(keys, fmt.Sprintf("%s %s (%s)", aws.ToString(k.AttributeName), k.KeyType, keyType[aws.ToString(k.AttributeName)]))
	}
	if len(t.KeySchema) == 1 && aws.ToString(t.KeySchema[0].AttributeName) == "pk" && keyType["pk"] == types.ScalarAttributeTypeS {
		return nil
	}
	return idemq.NewConfigError(component, "Table",
		"%s exists with key %s, but the store needs partition key pk (S) and no sort key; set Config.Table to another name or delete the table",
		s.cfg.Table, strings.Join(keys, ", "))
}

// apiErr wraps an error of DynamoDB. A missing table or a request the
// table's schema refuses will not heal by retrying: it also matches
// request.ErrMisconfigured, so front ends answer 500 and log it instead of
// 503.
func (s *Store) apiErr(op, key string, err error) error {
	var api interface{ ErrorCode() string }
	if errors.As(err, &api) && (api.ErrorCode() == "ResourceNotFoundException" || api.ErrorCode() == "ValidationException") {
		return fmt.Errorf("dynamostore: %s %q: %w: table %s is missing or has another key schema (run Store.CreateTable, which checks it): %w",
			op, key, request.ErrMisconfigured, s.cfg.Table, err)
	}
	return fmt.Errorf("dynamostore: %s %q: %w", op, key, err)
}

// ttlUnsupported reports the answer of a server without the TTL API, or
// of a table whose TTL is already on.
func ttlUnsupported(err error) bool {
	var api interface{ ErrorCode() string }
	if !errors.As(err, &api) {
		return false
	}
	switch api.ErrorCode() {
	case "UnknownOperationException", "ValidationException":
		return true
	}
	return false
}

// RecordTTL returns Config.RecordTTL.
func (s *Store) RecordTTL() time.Duration { return s.cfg.RecordTTL }

// MaxResponse is the largest encoded response an item keeps: DynamoDB's
// item limit of 400 KB less room for the key (scope and key, up to about
// 1.2 KB) and the other attributes. It implements
// [request.ResponseLimiter]: the Guard stores a larger response without
// its body instead of failing.
func (s *Store) MaxResponse() int { return MaxResponse }

// MaxResponse is [Store.MaxResponse].
const MaxResponse = 400<<10 - 4<<10

func pk(id request.ID) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": str(strconv.Itoa(len(id.Scope)) + ":" + id.Scope + ":" + id.Key)}
}

func str(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

func num(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

func bin(b []byte) types.AttributeValue { return &types.AttributeValueMemberB{Value: b} }

// expiry is the TTL attribute of a record changed at now: rounded up, so
// that the record lives at least RecordTTL.
func (s *Store) expiry(now time.Time) types.AttributeValue {
	return num(now.Add(s.cfg.RecordTTL + time.Second - 1).Unix())
}

// claimCondition takes a missing or expired item, or one of the same
// request that was released or whose lease ran out.
const claimCondition = `attribute_not_exists(pk) OR ex <= :now OR
	(f = :f AND (s = :released OR (s = :running AND lu <= :nowms)))`

// Claim implements [request.Store.Claim].
func (s *Store) Claim(ctx context.Context, id request.ID, fingerprint []byte, lease time.Duration) (request.Claim, error) {
	if id.Key == "" {
		return request.Claim{}, fmt.Errorf("%w: empty", request.ErrInvalidKey)
	}
	// The item read after a failed condition may have changed since: if
	// it is claimable by then, claim again.
	for range 3 {
		now := time.Now()
		until := now.Add(lease)
		out, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:           &s.cfg.Table,
			Key:                 pk(id),
			ConditionExpression: aws.String(claimCondition),
			UpdateExpression:    aws.String(`SET f = :f, s = :running, t = if_not_exists(t, :first) + :one, lu = :lu, ex = :ex REMOVE r`),
			ExpressionAttributeValues: map[string]types.AttributeValue{
				":f": bin(nonEmpty(fingerprint)), ":running": num(int64(request.InProgress)), ":released": num(int64(request.Released)),
				":now": num(now.Unix()), ":nowms": num(now.UnixMilli()), ":lu": num(until.UnixMilli()),
				":ex": s.expiry(now), ":one": num(1), ":first": num(now.UnixMicro()),
			},
			ReturnValues:                        types.ReturnValueUpdatedNew,
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		if err == nil {
			token, _ := strconv.ParseInt(numAttr(out.Attributes, "t"), 10, 64)
			return request.Claim{Acquired: true, Lease: idemq.Lease{Scope: id.Scope, Key: id.Key, Token: token, Until: until}}, nil
		}
		var failed *types.ConditionalCheckFailedException
		if !errors.As(err, &failed) {
			return request.Claim{}, s.apiErr("claim", id.Key, err)
		}
		item := failed.Item
		if item == nil {
			// Servers without ReturnValuesOnConditionCheckFailure.
			if item, err = s.read(ctx, id); err != nil {
				return request.Claim{}, err
			}
		}
		rec, err := s.record(id, item, time.Now())
		if errors.Is(err, request.ErrNotFound) {
			continue
		}
		if err != nil {
			return request.Claim{}, err
		}
		if string(rec.Fingerprint) != string(nonEmpty(fingerprint)) {
			return request.Claim{}, &request.ConflictError{ID: id, Fingerprint: fingerprint, Stored: rec}
		}
		if rec.State == request.Completed || (rec.State == request.InProgress && rec.LeaseUntil.After(time.Now())) {
			return request.Claim{Record: rec}, nil
		}
	}
	return request.Claim{}, fmt.Errorf("dynamostore: claim %q: the item changed under three claims in a row", id.Key)
}

// nonEmpty stands in for an empty fingerprint: DynamoDB refuses empty
// binary values in conditions.
func nonEmpty(fingerprint []byte) []byte {
	if len(fingerprint) == 0 {
		return []byte{0}
	}
	return fingerprint
}

// finishCondition holds while the caller's attempt holds the key.
const finishCondition = `s = :running AND t = :token`

// Complete implements [request.Store.Complete].
func (s *Store) Complete(ctx context.Context, lease idemq.Lease, resp request.Response) error {
	body, err := resp.MarshalBinary()
	if err != nil {
		return err
	}
	return s.finish(ctx, "complete", lease, `SET s = :s, r = :r, ex = :ex REMOVE lu`, map[string]types.AttributeValue{
		":s": num(int64(request.Completed)), ":r": bin(body), ":ex": s.expiry(time.Now()),
	})
}

// Release implements [request.Store.Release].
func (s *Store) Release(ctx context.Context, lease idemq.Lease) error {
	return s.finish(ctx, "release", lease, `SET s = :s, ex = :ex REMOVE lu`, map[string]types.AttributeValue{
		":s": num(int64(request.Released)), ":ex": s.expiry(time.Now()),
	})
}

// Extend implements [request.Store.Extend].
func (s *Store) Extend(ctx context.Context, lease idemq.Lease, d time.Duration) (idemq.Lease, error) {
	until := time.Now().Add(d)
	err := s.finish(ctx, "extend", lease, `SET lu = :lu`, map[string]types.AttributeValue{":lu": num(until.UnixMilli())})
	if err == nil {
		lease.Until = until
	}
	return lease, err
}

func (s *Store) finish(ctx context.Context, op string, lease idemq.Lease, update string, values map[string]types.AttributeValue) error {
	values[":running"] = num(int64(request.InProgress))
	values[":token"] = num(lease.Token)
	_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &s.cfg.Table,
		Key:                       pk(request.ID{Scope: lease.Scope, Key: lease.Key}),
		ConditionExpression:       aws.String(finishCondition),
		UpdateExpression:          &update,
		ExpressionAttributeValues: values,
	})
	var failed *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &failed):
		return idemq.ErrLeaseLost
	case err != nil:
		return s.apiErr(op, lease.Key, err)
	}
	return nil
}

// Get implements [request.Store.Get].
func (s *Store) Get(ctx context.Context, id request.ID) (request.Record, error) {
	item, err := s.read(ctx, id)
	if err != nil {
		return request.Record{}, err
	}
	return s.record(id, item, time.Now())
}

func (s *Store) read(ctx context.Context, id request.ID) (map[string]types.AttributeValue, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: &s.cfg.Table, Key: pk(id), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, s.apiErr("get", id.Key, err)
	}
	return out.Item, nil
}

// record translates an item; a missing or expired one is ErrNotFound.
func (s *Store) record(id request.ID, item map[string]types.AttributeValue, now time.Time) (request.Record, error) {
	ex, _ := strconv.ParseInt(numAttr(item, "ex"), 10, 64)
	if item == nil || ex <= now.Unix() {
		return request.Record{}, request.ErrNotFound
	}
	state, _ := strconv.Atoi(numAttr(item, "s"))
	token, _ := strconv.ParseInt(numAttr(item, "t"), 10, 64)
	rec := request.Record{ID: id, Fingerprint: binAttr(item, "f"), State: request.State(state), Token: token, ExpiresAt: time.Unix(ex, 0)}
	switch rec.State {
	case request.InProgress:
		lu, _ := strconv.ParseInt(numAttr(item, "lu"), 10, 64)
		rec.LeaseUntil = time.UnixMilli(lu)
	case request.Completed:
		rec.Response = &request.Response{}
		if err := rec.Response.UnmarshalBinary(binAttr(item, "r")); err != nil {
			return rec, fmt.Errorf("dynamostore: record %q: %w", id.Key, err)
		}
	case request.Released:
	default:
		return rec, fmt.Errorf("dynamostore: record %q has state %d", id.Key, state)
	}
	return rec, nil
}

func numAttr(item map[string]types.AttributeValue, name string) string {
	if v, ok := item[name].(*types.AttributeValueMemberN); ok {
		return v.Value
	}
	return ""
}

func binAttr(item map[string]types.AttributeValue, name string) []byte {
	if v, ok := item[name].(*types.AttributeValueMemberB); ok {
		return v.Value
	}
	return nil
}
