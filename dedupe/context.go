package dedupe

import "context"

type sourceKey struct{}

// SourceContextKey is the context key under which [ContextWithSource]
// stores a message's Source, as [SourceFromContext] reads it: a
// transport whose messages' contexts are of its own type answers it from
// Value without a context.WithValue per message. The associated value is
// a Source.
var SourceContextKey any = sourceKey{}

// ContextWithSource returns a copy of ctx that carries src, the Kafka
// coordinates of the message being handled. A Subscriber sets it on each
// message it delivers (kafkapubsub.Subscriber does); the middleware reads it
// back with [SourceFromContext] to record where a key came from.
func ContextWithSource(ctx context.Context, src Source) context.Context {
	return context.WithValue(ctx, sourceKey{}, src)
}

// SourceFromContext returns the coordinates that [ContextWithSource] put in
// ctx; ok is false when there are none.
func SourceFromContext(ctx context.Context) (src Source, ok bool) {
	src, ok = ctx.Value(sourceKey{}).(Source)
	return src, ok
}

type deliveriesKey struct{}

// ContextWithDeliveries returns a copy of ctx that carries n, how many
// times the message being handled has been delivered so far, this time
// included, by every member. A Subscriber whose records move between
// members and offsets sets it (a share group's: kgopubsub.ShareSubscriber),
// and gives a copy of a record its original's coordinates
// ([ContextWithSource]): the middleware counts a message's failed attempts
// towards MaxAttempts by its key, ID and coordinates, so that the copies of
// one record add up. Only its own failures count, in each process: a
// delivery that ended in a crash, a lock that ran out, or an outage does
// not; but a message delivered more than twice MaxAttempts times in all,
// crashes included, is dead-lettered before its handler runs. It also says that the message's records come in no order: in batch
// mode, a nacked one holds no partition back.
func ContextWithDeliveries(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, deliveriesKey{}, n)
}

// DeliveriesFromContext returns the count that [ContextWithDeliveries] put
// in ctx; ok is false when there is none.
func DeliveriesFromContext(ctx context.Context) (n int, ok bool) {
	n, ok = ctx.Value(deliveriesKey{}).(int)
	return n, ok
}

type batchClaimsKey struct{}

// ContextWithBatchClaims returns a copy of ctx that carries a batch's
// claims, as a batch store decided them before its handler runs: one per
// request, in the requests' order. A batch store ([BatchClaim]'s doc) sets
// it on the ctx it hands its handler function.
func ContextWithBatchClaims(ctx context.Context, claims []BatchClaim) context.Context {
	return context.WithValue(ctx, batchClaimsKey{}, claims)
}

// BatchClaimsFromContext returns the claims that [ContextWithBatchClaims]
// put in ctx (read them, do not change them): a batch handler can tell from
// them why a request is not fresh (a duplicate, a key reuse, a key in
// flight).
func BatchClaimsFromContext(ctx context.Context) ([]BatchClaim, bool) {
	claims, ok := ctx.Value(batchClaimsKey{}).([]BatchClaim)
	return claims, ok
}
