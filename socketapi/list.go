package socketapi

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/internal/wire"
)

// The list op: sessions answered a chunk at a time, in pages.

// listChunk is how many sessions list asks the agent for at a time.
const listChunk = 256

// listPageBytes bounds a list answer with a limit: it ends before a
// session that would take it past this size (but never before its first
// session), and next says where to go on.
const listPageBytes = 256 << 10

// list answers with the sessions asked for, encoded a chunk at a time and
// charged to the output budget as the answer grows. The lists of one uid
// are built one at a time.
func (c *conn) list(ctx context.Context, id json.RawMessage, req *request) bool {
	all := req.All != nil && *req.All
	limit := 0 // every session
	if req.Limit != nil {
		if *req.Limit < 1 || *req.Limit > 1<<31 {
			c.reply(id, nil, fmt.Errorf("%w: limit must be a positive integer", agent.ErrInvalidArgument))
			return true
		}
		limit = int(*req.Limit)
	}
	after := ""
	if req.After != nil {
		after = *req.After
	}
	release, err := c.srv.lists.take(ctx, c.peer.UID)
	if err != nil {
		return false // the connection is ending
	}
	line := c.buildList(id, all, limit, after)
	release()
	c.out.put(line, true)
	return true
}

// buildList builds list's answer, or the error that goes in its place,
// charged to the output budget.
func (c *conn) buildList(id json.RawMessage, all bool, limit int, after string) []byte {
	ans := answerBuf{o: c.out}
	if !ans.add([]byte(`{"id":`), id, []byte(`,"ok":true,"sessions":[`)) {
		return c.refused(id, 0)
	}
	n, next := 0, ""
	for next == "" {
		chunk := listChunk
		if limit > 0 {
			chunk = min(chunk, limit-n)
		}
		infos, more, err := c.sess.List(agent.ListRequest{All: all, After: after, Limit: chunk})
		if err != nil {
			ans.drop()
			line := c.errorLine(id, err)
			c.out.charge(len(line), false)
			return line
		}
		for _, si := range infos {
			sj := marshalValue(toSession(si))
			if limit > 0 && n > 0 && len(ans.b)+len(sj) > listPageBytes {
				next = after
				break
			}
			sep := []byte{','}
			if n == 0 {
				sep = nil
			}
			if !ans.add(sep, sj) {
				size := len(ans.b) + len(sj)
				ans.drop()
				return c.refused(id, size)
			}
			n++
			after = si.ID
		}
		if !more {
			break
		}
		if limit > 0 && n == limit {
			next = after
		}
	}
	nextJSON := []byte("null")
	if next != "" {
		nextJSON = wire.AppendString(nil, next)
	}
	if !ans.add([]byte(`],"next":`), nextJSON, []byte("}\n")) {
		size := len(ans.b)
		ans.drop()
		return c.refused(id, size)
	}
	return ans.b
}

// refused is tooLarge's line, charged.
func (c *conn) refused(id json.RawMessage, size int) []byte {
	line := c.tooLarge(id, size)
	c.out.charge(len(line), false)
	return line
}
