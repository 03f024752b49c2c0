// Package consumertest tests a handler behind the exactly middleware
// without a router or a broker: [Handler] runs it through a real
// [consumer.Middleware] against one message at a time and reports the
// outcome, the outputs and the key as stored ([Result]); [BatchHandler]
// runs a batch handler through a real [consumer.BatchConsumer] against the
// messages of one delivery and reports the same for each, and whether it
// was acked ([BatchResult]); [BatchParity] checks that a batch handler
// leaves the same state as one message at a time (a batch statement that
// updates a row once for two messages does not).
//
// Two stores fit:
//
//   - [MemStore], in memory, for handlers (per-message and batch) that
//     write no SQL. It decides as pgstore does ([dedupe.Decide]) and
//     passes the same conformance suite (dedupetest.Exercise); its
//     transactions ([Tx]) run no SQL and record whether they were
//     committed or rolled back. It is an [httpkey.Store] too, for HTTP
//     handlers behind the httpkey middleware that write no SQL.
//   - [*pgstore.Store] on a pool, for handlers that write SQL: the handler
//     gets a real transaction, and a test reads its writes back.
//
// A test in memory:
//
//	store := consumertest.NewMemStore(nil)
//	h, err := consumertest.NewHandler(store, consumer.TxHandler(handle), &consumer.Config{Scope: "ledger"})
//	if err != nil {
//		t.Fatal(err)
//	}
//	msg := message.NewMessage("3f0c…", []byte(`{"amount":5}`))
//	if r := h.Run(ctx, t, msg); r.Outcome != consumer.OutcomeApplied {
//		t.Fatalf("first delivery: %s, %v", r.Outcome, r.Err)
//	}
//	if r := h.Run(ctx, t, msg); r.Outcome != consumer.OutcomeDuplicate {
//		t.Fatalf("second delivery: %s, %v", r.Outcome, r.Err)
//	}
//
// A batch handler, the same way:
//
//	bh, err := consumertest.NewBatchHandler(store, handleBatch, &consumer.BatchConfig{Config: consumer.Config{Scope: "ledger"}})
//	if err != nil {
//		t.Fatal(err)
//	}
//	for _, r := range bh.Run(ctx, t, msg1, msg2, msg1) { // msg1's copy is a duplicate
//		if !r.Acked {
//			t.Errorf("%s: %s, %v", r.Key, r.Outcome, r.Err)
//		}
//	}
package consumertest
