// Package client is the Go client of lockagent: it talks to the agent of
// its host over the agent's Unix socket, in the wire protocol of
// docs/protocol.md. It depends on the standard library alone, so an
// application that takes locks pulls in nothing of the agent.
//
//	c, err := client.Dial(ctx, client.SocketPath(*socketFlag))
//	if err != nil { ... }
//	defer c.Close() // releases the connection's leases
//	if _, err := c.Hello(ctx, client.HelloOptions{Client: "billing-worker"}); err != nil { ... }
//
//	lease, err := c.Acquire(ctx, "orders/42", client.AcquireOptions{Wait: 5 * time.Second})
//	if errors.Is(err, client.ErrNotAcquired) { ... } // held by others, for 5s
//	if err != nil { ... }
//	defer lease.Release(ctx)
//	// Work, handing lease.Token to what the lock protects, and stop if
//	// lease.Done() is closed: the lease was lost (lease.Reason() says why).
//
// A Lease ends when it is released, lost (its lost event closes Done) or
// when the connection ends. A Campaign contends for leadership of a name
// term after term; each Term has its own Done. Every op of the protocol
// has its method: Hello, Acquire (Lease.Release, Lease.Check), Inspect,
// List, Break, Campaign (Campaign.Resign), Status, Ping and Bye; a
// waiting acquire is cancelled by ending its context. Errors the agent
// answers are *Error values with the protocol's code, matched with
// errors.Is against ErrNotHeld and the other Err variables. Call sends any
// op as it is; Events delivers the events that no Lease or Campaign takes.
//
// The client is a package of the lockagent module, not a module of its
// own: one version covers both ends of the protocol, and `go install` of
// the agent keeps working from a single module. A test keeps it to the
// standard library (see TestDependencies).
package client
