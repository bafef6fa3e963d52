package request

import "context"

// tenantKey carries the name of a request's tenant database in its context.
type tenantKey struct{}

// WithTenant returns ctx carrying name, the database of the request's
// tenant, for a store that keeps each tenant's records in its own database
// (pgstore.Routed). Set it in a handler or interceptor that runs before
// the idempotency middleware, from the host, a header or the caller's
// credentials.
func WithTenant(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, tenantKey{}, name)
}

// Tenant returns the tenant database name WithTenant put in ctx, and
// whether there was one.
func Tenant(ctx context.Context) (string, bool) {
	name, ok := ctx.Value(tenantKey{}).(string)
	return name, ok && name != ""
}
