package socketapi_test

import (
	"fmt"
	"testing"

	"go.uber.org/goleak"
)

// TestNoGoroutineOutlivesASession: sessions that held, waited, were
// cancelled, were cut off or said bye leave no goroutine behind while the
// agent runs on. (TestMain checks the same for the whole agent at exit.)
func TestNoGoroutineOutlivesASession(t *testing.T) {
	ta := startAgent(t)
	admin := ta.raw(t)
	admin.ok(`{"op":"ping"}`)
	before := goleak.IgnoreCurrent()

	holder := ta.raw(t)
	m := holder.ok(`{"op":"acquire","name":"leak","scope":"session"}`)
	for i := 0; i < 20; i++ {
		r := ta.raw(t)
		r.ok(fmt.Sprintf(`{"op":"acquire","name":"leak/%d","ttl_ms":1000}`, i))
		r.send(`{"id":"w","op":"acquire","name":"leak","wait_ms":-1}`)
		switch i % 4 {
		case 0:
			r.send(`{"op":"cancel","target":"w"}`)
			r.recv() // the cancel's answer and the acquire's, in either order
			r.recv()
			r.nc.Close()
		case 1:
			r.send(`{"op":"bye"}`)
			r.requireClosed()
		case 2:
			r.send("x" + string(make([]byte, 70000)))
			r.requireClosed()
		default:
			r.nc.Close()
		}
	}
	holder.ok(fmt.Sprintf(`{"op":"release","lease":%q}`, m["lease"]))
	holder.nc.Close()
	goleak.VerifyNone(t, before)
}
