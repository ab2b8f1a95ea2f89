package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scrape fetches url and returns every sample, keyed by its name and
// labels as written ("name{a=\"b\"}").
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	samples := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, "sample %q", line)
		samples[line[:i]] = v
	}
	require.NoError(t, sc.Err())
	return samples
}

var metricsURL = regexp.MustCompile(`metrics served: address=(http://\S+/metrics)`)

// TestMetricsAfterAWorkload: after a scripted workload, /metrics shows
// exactly its figures.
func TestMetricsAfterAWorkload(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	e.writeConfig(t, "metrics {\n  address = \"127.0.0.1:0\"\n}\n")
	a := e.start(t)
	var url string
	eventually(t, exitTimeout, "the metrics address is logged", func() bool {
		m := metricsURL.FindStringSubmatch(a.stderr.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	})

	// The workload: 4 exclusive grants (one session-scoped), 2 shared, a
	// try denied, a wait that times out, a waiter left waiting, a break.
	holder := dialAgent(t, e.socket, "holder")
	for _, n := range []string{"m/1", "m/2", "m/3"} {
		mustAcquire(t, holder, n, map[string]any{"ttl_ms": 1000})
	}
	mustAcquire(t, holder, "m/session", map[string]any{"scope": "session"})
	for range 2 {
		mustAcquire(t, dialAgent(t, e.socket, "reader"), "m/shared", map[string]any{"mode": "shared"})
	}
	other := dialAgent(t, e.socket, "other")
	require.False(t, tryAcquire(t, other, "m/1", nil).Acquired)
	var timedOut lease
	call(t, other, "acquire", map[string]any{"name": "m/2", "wait_ms": 100}, &timedOut)
	require.Equal(t, "timeout", timedOut.Reason)
	waiter := dialAgent(t, e.socket, "waiter")
	go waiter.Call(context.Background(), "acquire", map[string]any{"name": "m/3", "wait_ms": -1}, nil)
	var broken struct {
		Broken int `json:"broken"`
	}
	call(t, dialAgent(t, e.socket, "admin"), "break", map[string]any{"name": "m/1"}, &broken)
	require.Equal(t, 1, broken.Broken)
	// Two acquires refused before they reach the agent, counted all the same.
	require.Error(t, other.Call(t.Context(), "acquire", map[string]any{"name": "m/4", "mode": "shared", "ttl_ms": 0}, nil))
	require.Error(t, other.Call(t.Context(), "acquire", map[string]any{"name": "m/4", "mode": "neither"}, nil))

	var s map[string]float64
	// The waiter is queued, and the 1s leases have been renewed (at a
	// third of their TTL) at least once. A scrape is not one instant: one
	// taken while a renewal is recorded may count it in one histogram and
	// not yet in the other, so the test waits for one that agrees.
	eventually(t, exitTimeout, "the waiter and a renewal", func() bool {
		s = scrape(t, url)
		return s["lockagent_waiters"] == 1 && s["lockagent_renewal_batch_size_count"] > 0 &&
			s["lockagent_renewal_duration_seconds_count"] == s["lockagent_renewal_batch_size_count"]
	})
	want := map[string]float64{
		`lockagent_acquisitions_total{mode="exclusive",result="granted"}`: 4,
		`lockagent_acquisitions_total{mode="shared",result="granted"}`:    2,
		`lockagent_acquisitions_total{mode="exclusive",result="held"}`:    1,
		`lockagent_acquisitions_total{mode="exclusive",result="timeout"}`: 1,
		`lockagent_acquire_wait_seconds_count{result="granted"}`:          6,
		`lockagent_acquire_wait_seconds_count{result="timeout"}`:          1,
		`lockagent_leases{mode="exclusive",scope="connection"}`:           2,
		`lockagent_leases{mode="exclusive",scope="session"}`:              1,
		`lockagent_leases{mode="shared",scope="connection"}`:              2,
		`lockagent_leases{mode="shared",scope="session"}`:                 0,
		`lockagent_sessions`:                                             6,
		`lockagent_waiters`:                                              1,
		`lockagent_leases_lost_total{reason="broken"}`:                   1,
		`lockagent_leases_lost_total{reason="expired"}`:                  0,
		`lockagent_acquisitions_total{mode="shared",result="error"}`:     1,
		`lockagent_acquisitions_total{mode="exclusive",result="error"}`:  1,
		`lockagent_acquire_wait_seconds_count{result="canceled"}`:        0,
		`lockagent_backend_errors_total{op="renew"}`:                     0,
		`lockagent_backend_degraded`:                                     0,
		`lockagent_renewals_failed_total`:                                0,
		`lockagent_info{backend="memory",version="` + testVersion + `"}`: 1,
	}
	for k, v := range want {
		got, ok := s[k]
		if assert.True(t, ok, "%s is missing", k) {
			assert.Equal(t, v, got, k)
		}
	}
	assert.Greater(t, s["lockagent_acquire_wait_seconds_sum{result=\"timeout\"}"], 0.09, "the timed-out wait took its 100ms")
	assert.Greater(t, s["lockagent_renewal_duration_seconds_count"], 0.0)
	assert.Equal(t, s["lockagent_renewal_duration_seconds_count"], s["lockagent_renewal_batch_size_count"])
	assert.InDelta(t, float64(time.Now().Unix()), s["lockagent_start_time_seconds"], 60)

	// A dropped connection releases: the gauges follow.
	require.NoError(t, holder.Close())
	// The waiter's grant is in the gauges a moment before its acquire is
	// counted, when it is answered: the test waits for both.
	eventually(t, exitTimeout, "the holder's leases are gone and the waiter granted", func() bool {
		s = scrape(t, url)
		return s[`lockagent_leases{mode="exclusive",scope="connection"}`] == 1 && // the waiter's m/3
			s[`lockagent_acquisitions_total{mode="exclusive",result="granted"}`] == 5
	})
	assert.Equal(t, 0.0, s[`lockagent_leases{mode="exclusive",scope="session"}`])
	assert.Equal(t, 0.0, s["lockagent_waiters"])

	resp, err := http.Get(strings.TrimSuffix(url, "/metrics") + "/other")
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	stopAgent(t, a)
}
