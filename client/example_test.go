package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend/memory"
	"github.com/lockagent/lockagent/client"
	"github.com/lockagent/lockagent/socketapi"
)

// Acquire a lock, hand its fencing token to what it protects, release it.
func Example() {
	socket, stop := startExampleAgent()
	defer stop()
	ctx := context.Background()

	c, err := client.Dial(ctx, socket) // or client.SocketPath("") to find the host's agent
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close() // the end of the connection releases its leases
	s, err := c.Hello(ctx, client.HelloOptions{Client: "billing-worker"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("agent backend:", s.Agent.Backend)

	lease, err := c.Acquire(ctx, "orders/42", client.AcquireOptions{Meta: "invoice run"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("acquired", lease.Name, lease.Mode)
	// Write to the store with lease.Token: it refuses any write with a
	// token smaller than one it has seen.
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("lease ended:", lease.Reason())
	// Output:
	// agent backend: memory
	// acquired orders/42 exclusive
	// lease ended: released
}

// A try (the default) is answered at once; a wait up to a duration ends
// with reason "timeout". Both are a *NotAcquiredError.
func ExampleClient_Acquire_try() {
	socket, stop := startExampleAgent()
	defer stop()
	ctx := context.Background()
	holder, other := exampleClient(ctx, socket), exampleClient(ctx, socket)
	defer holder.Close()
	defer other.Close()

	if _, err := holder.Acquire(ctx, "orders/42", client.AcquireOptions{Meta: "invoice run"}); err != nil {
		log.Fatal(err)
	}

	_, err := other.Acquire(ctx, "orders/42", client.AcquireOptions{})
	var denied *client.NotAcquiredError
	if errors.As(err, &denied) {
		fmt.Printf("try: %s (holder: %s)\n", denied.Reason, denied.Holders[0].Meta)
	}
	_, err = other.Acquire(ctx, "orders/42", client.AcquireOptions{Wait: 50 * time.Millisecond})
	if errors.Is(err, client.ErrNotAcquired) {
		fmt.Println("wait 50ms:", err.(*client.NotAcquiredError).Reason)
	}
	// Output:
	// try: held (holder: invoice run)
	// wait 50ms: timeout
}

// Wait without a limit, bounded by a context; the lock is granted once
// its holder releases it, with a larger fencing token.
func ExampleClient_Acquire_wait() {
	socket, stop := startExampleAgent()
	defer stop()
	ctx := context.Background()
	holder, waiter := exampleClient(ctx, socket), exampleClient(ctx, socket)
	defer holder.Close()
	defer waiter.Close()

	first, err := holder.Acquire(ctx, "reports/daily", client.AcquireOptions{})
	if err != nil {
		log.Fatal(err)
	}

	// The context's end cancels the wait.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = waiter.Acquire(short, "reports/daily", client.AcquireOptions{Wait: client.WaitForever})
	fmt.Println("gave up:", errors.Is(err, context.DeadlineExceeded))

	go func() {
		if err := first.Release(ctx); err != nil {
			log.Fatal(err)
		}
	}()
	second, err := waiter.Acquire(ctx, "reports/daily", client.AcquireOptions{Wait: client.WaitForever})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("acquired after the holder released it:", first.Reason())
	fmt.Println("larger token:", second.Token > first.Token)
	// Output:
	// gave up: true
	// acquired after the holder released it: released
	// larger token: true
}

// A shared lock with a limit is a counting semaphore: here, at most two
// holders at a time. Each holder is a connection of its own: a session
// holds a name once.
func ExampleClient_Acquire_shared() {
	socket, stop := startExampleAgent()
	defer stop()
	ctx := context.Background()
	shared := client.AcquireOptions{Mode: client.ModeShared, Limit: 2}

	for i := 1; i <= 3; i++ {
		c := exampleClient(ctx, socket)
		defer c.Close()
		lease, err := c.Acquire(ctx, "gpu/slots", shared)
		var denied *client.NotAcquiredError
		switch {
		case errors.As(err, &denied):
			fmt.Printf("worker %d: not acquired (%s, %d holders)\n", i, denied.Reason, len(denied.Holders))
		case err != nil:
			log.Fatal(err)
		default:
			fmt.Printf("worker %d: acquired %s\n", i, lease.Mode)
		}
	}
	// Output:
	// worker 1: acquired shared
	// worker 2: acquired shared
	// worker 3: not acquired (held, 2 holders)
}

// A lease can be lost while held: here an admin breaks it. Done is
// closed and Reason says why; the lease is dead, and releasing it gets
// ErrNotHeld.
func ExampleLease_Done() {
	socket, stop := startExampleAgent()
	defer stop()
	ctx := context.Background()
	worker, admin := exampleClient(ctx, socket), exampleClient(ctx, socket)
	defer worker.Close()
	defer admin.Close()

	lease, err := worker.Acquire(ctx, "orders/42", client.AcquireOptions{})
	if err != nil {
		log.Fatal(err)
	}
	// As `lockagent ctl break orders/42` would:
	if _, err := admin.Break(ctx, "orders/42"); err != nil {
		log.Fatal(err)
	}

	select {
	case <-lease.Done():
		fmt.Println("lease lost:", lease.Reason())
	case <-time.After(10 * time.Second): // the work, done under the lock
		fmt.Println("work done")
	}
	err = lease.Release(ctx)
	fmt.Println("release:", errors.Is(err, client.ErrNotHeld))
	// Output:
	// lease lost: broken
	// release: true
}

// Errors the agent answers are *Error values with the protocol's code.
func ExampleError() {
	socket, stop := startExampleAgent()
	defer stop()
	ctx := context.Background()
	c := exampleClient(ctx, socket)
	defer c.Close()

	if _, err := c.Acquire(ctx, "orders/42", client.AcquireOptions{}); err != nil {
		log.Fatal(err)
	}
	_, err := c.Acquire(ctx, "orders/42", client.AcquireOptions{})
	fmt.Println("already held:", errors.Is(err, client.ErrAlreadyHeld))

	_, err = c.Acquire(ctx, "no spaces", client.AcquireOptions{})
	var e *client.Error
	if errors.As(err, &e) {
		fmt.Println("code:", e.Code)
	}
	// Output:
	// already held: true
	// code: invalid_name
}

// Two candidates campaign for leadership; when the leader resigns, the
// other is elected, with a larger fencing token.
func ExampleClient_Campaign() {
	socket, stop := startExampleAgent()
	defer stop()
	ctx := context.Background()
	web1, web2 := exampleClient(ctx, socket), exampleClient(ctx, socket)
	defer web1.Close()
	defer web2.Close()

	c1, err := web1.Campaign(ctx, "svc/scheduler", client.CampaignOptions{Meta: "web-1"})
	if err != nil {
		log.Fatal(err)
	}
	term1 := <-c1.Elected()
	c2, err := web2.Campaign(ctx, "svc/scheduler", client.CampaignOptions{Meta: "web-2"})
	if err != nil {
		log.Fatal(err)
	}
	in, err := web2.Inspect(ctx, "svc/scheduler")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("leader:", in.Holders[0].Meta)

	if err := c1.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("web-1's term:", term1.Reason())
	term2 := <-c2.Elected()
	fmt.Println("web-2 elected, larger token:", term2.Token > term1.Token)
	// Output:
	// leader: web-1
	// web-1's term: resigned
	// web-2 elected, larger token: true
}

// An explicit path wins; without one, LOCKAGENT_SOCKET, then the default
// path.
func ExampleSocketPath() {
	fmt.Println(client.SocketPath("/srv/app/lockagent.sock"))
	// Output: /srv/app/lockagent.sock
}

// PingAgent tells whether an agent serves a socket: a health check.
func ExamplePingAgent() {
	socket, stop := startExampleAgent()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()

	fmt.Println("agent:", client.PingAgent(ctx, socket) == nil)
	fmt.Println("nothing:", client.PingAgent(ctx, socket+".none") == nil)
	// Output:
	// agent: true
	// nothing: false
}

// exampleClient dials the agent and says hello.
func exampleClient(ctx context.Context, socket string) *client.Client {
	c, err := client.Dial(ctx, socket)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.Hello(ctx, client.HelloOptions{Client: "example"}); err != nil {
		log.Fatal(err)
	}
	return c
}

// startExampleAgent runs an agent on the memory backend, as the lockagent
// binary would, on a socket in a new directory. stop stops it and removes
// the directory.
func startExampleAgent() (socket string, stop func()) {
	dir, err := os.MkdirTemp("", "la")
	if err != nil {
		log.Fatal(err)
	}
	b, err := memory.Open(filepath.Join(dir, "state"))
	if err != nil {
		log.Fatal(err)
	}
	a := agent.New(agent.Config{Backend: b, Host: "example",
		Access: agent.Access{AdminUIDs: []uint32{uint32(os.Getuid())}}})
	socket = filepath.Join(dir, "s")
	ln, err := socketapi.Listen(socket, 0o600, "")
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { a.Run(ctx); done <- struct{}{} }()
	go func() { (&socketapi.Server{Agent: a}).Serve(ctx, ln); done <- struct{}{} }()
	return socket, func() {
		cancel()
		<-done
		<-done
		b.Close()
		os.RemoveAll(dir)
	}
}
