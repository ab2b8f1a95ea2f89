// Package socketapi speaks lockagent's wire protocol, version 1: newline-
// delimited JSON over a Unix stream socket (docs/protocol.md). It has both
// ends of it.
//
// The server side owns the listener, each connection's read loop and
// single writer, the poller where idle connections wait without a
// goroutine, framing limits, peer credentials and the mapping of errors
// to wire codes. It drives the agent package and knows nothing of
// how locks are stored.
//
// The client side, Client, is the Go client of the agent, for
// applications as for `lockagent ctl` and `lockagent run`:
//
//	c, err := socketapi.Dial(ctx, socketapi.SocketPath(*socketFlag))
//	if err != nil { ... }
//	defer c.Close() // releases the connection's leases
//	if _, err := c.Hello(ctx, socketapi.HelloOptions{Client: "billing-worker"}); err != nil { ... }
//
//	lease, err := c.Acquire(ctx, "orders/42", socketapi.AcquireOptions{Wait: 5 * time.Second})
//	if errors.Is(err, socketapi.ErrNotAcquired) { ... } // held by others, for 5s
//	if err != nil { ... }
//	defer lease.Release(ctx)
//	// Work, handing lease.Token to what the lock protects, and stop if
//	// lease.Done() is closed: the lease was lost (lease.Reason() says why).
//
// A Lease ends when it is released, lost (its lost event closes Done) or
// when the connection ends. A Campaign contends for leadership of a name
// term after term; each Term has its own Done. Errors the agent answers
// are *Error values with the protocol's code, matched with errors.Is
// against ErrNotHeld and the other Err variables. Call sends any op of the
// protocol; Events delivers the events that no Lease or Campaign takes.
package socketapi
