package dedupe

import "context"

type sourceKey struct{}

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
