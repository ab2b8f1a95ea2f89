package socketapi_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// The benchmarks compare the agent with a plain Unix-socket echo server
// measured in the same run, so that the figures mean the same on a noisy
// machine: the ratios are what the targets are about.
//
//	go test ./socketapi -run '^$' -bench . -benchtime 50000x
//
// BenchmarkPairLatency reports the p50 of an acquire+release pair on one
// session against the p50 of two echo round trips (target: ≤ 4×).
// BenchmarkThroughput64 reports acquire+release pairs per second over 64
// sessions against echo round trips per second over 64 connections
// (target: ≥ 25%).

// echoServer answers every line with itself.
func echoServer(b *testing.B) string {
	dir, err := os.MkdirTemp("", "le")
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(dir, "e")
	ln, err := net.Listen("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	b.Cleanup(func() { ln.Close(); wg.Wait(); os.RemoveAll(dir) })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadSlice('\n')
					if err != nil {
						return
					}
					if _, err := c.Write(line); err != nil {
						return
					}
				}
			}()
		}
	}()
	return path
}

// lineConn is a minimal client: write a line, read a line.
type lineConn struct {
	nc net.Conn
	r  *bufio.Reader
}

func dialLine(b *testing.B, path string) *lineConn {
	nc, err := net.Dial("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { nc.Close() })
	return &lineConn{nc: nc, r: bufio.NewReader(nc)}
}

func (c *lineConn) roundTrip(line []byte) []byte {
	if _, err := c.nc.Write(line); err != nil {
		panic(err)
	}
	resp, err := c.r.ReadSlice('\n')
	if err != nil {
		panic(err)
	}
	return resp
}

var leaseKey = []byte(`"lease":"`)

// pair acquires name and releases it: two round trips.
func (c *lineConn) pair(acquire []byte) {
	resp := c.roundTrip(acquire)
	i := bytes.Index(resp, leaseKey)
	if i < 0 {
		panic(fmt.Sprintf("not granted: %s", resp))
	}
	rest := resp[i+len(leaseKey):]
	id := rest[:bytes.IndexByte(rest, '"')]
	c.roundTrip(fmt.Appendf(nil, `{"id":2,"op":"release","lease":"%s"}`+"\n", id))
}

var echoLine = []byte(`{"id":1,"op":"acquire","name":"bench/0000"}` + "\n")

func percentile(d []time.Duration, p float64) time.Duration {
	slices.Sort(d)
	return d[int(float64(len(d)-1)*p)]
}

func BenchmarkPairLatency(b *testing.B) {
	ta := startAgent(b)
	echo := dialLine(b, echoServer(b))
	agent := dialLine(b, ta.path)
	acquire := []byte(`{"id":1,"op":"acquire","name":"bench/0000"}` + "\n")
	// Warm up both.
	for i := 0; i < 1000; i++ {
		echo.roundTrip(echoLine)
		agent.pair(acquire)
	}
	echoT := make([]time.Duration, 0, b.N)
	agentT := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		echo.roundTrip(echoLine)
		echo.roundTrip(echoLine)
		t1 := time.Now()
		agent.pair(acquire)
		t2 := time.Now()
		echoT = append(echoT, t1.Sub(t0))
		agentT = append(agentT, t2.Sub(t1))
	}
	b.StopTimer()
	e50, a50 := percentile(echoT, 0.5), percentile(agentT, 0.5)
	b.ReportMetric(float64(e50.Nanoseconds())/1e3, "echo-pair-p50-µs")
	b.ReportMetric(float64(a50.Nanoseconds())/1e3, "pair-p50-µs")
	b.ReportMetric(float64(percentile(agentT, 0.99).Nanoseconds())/1e3, "pair-p99-µs")
	b.ReportMetric(float64(percentile(echoT, 0.99).Nanoseconds())/1e3, "echo-pair-p99-µs")
	b.ReportMetric(float64(a50)/float64(e50), "p50-ratio")
	b.ReportMetric(0, "ns/op")
}

// run64 runs n operations on each of 64 connections at once and returns
// the elapsed time.
func run64(conns []*lineConn, n int, op func(i int, c *lineConn)) time.Duration {
	var wg sync.WaitGroup
	start := time.Now()
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < n; j++ {
				op(i, c)
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

func BenchmarkThroughput64(b *testing.B) {
	const sessions = 64
	ta := startAgent(b)
	echoPath := echoServer(b)
	var echo, agent []*lineConn
	var acquires [][]byte
	for i := 0; i < sessions; i++ {
		echo = append(echo, dialLine(b, echoPath))
		agent = append(agent, dialLine(b, ta.path))
		acquires = append(acquires, fmt.Appendf(nil, `{"id":1,"op":"acquire","name":"bench/%04d"}`+"\n", i))
	}
	// Alternate short rounds of each, so that a burst of load from
	// elsewhere hits both alike.
	const rounds = 10
	n := max(b.N/sessions/rounds, 20)
	run64(echo, n, func(_ int, c *lineConn) { c.roundTrip(echoLine) })
	run64(agent, n, func(i int, c *lineConn) { c.pair(acquires[i]) })
	b.ResetTimer()
	var echoD, agentD time.Duration
	for r := 0; r < rounds; r++ {
		echoD += run64(echo, n, func(_ int, c *lineConn) { c.roundTrip(echoLine) })
		agentD += run64(agent, n, func(i int, c *lineConn) { c.pair(acquires[i]) })
	}
	b.StopTimer()
	total := float64(n * sessions * rounds)
	echoRate, pairRate := total/echoD.Seconds(), total/agentD.Seconds()
	b.ReportMetric(echoRate, "echo-rt/s")
	b.ReportMetric(pairRate, "pairs/s")
	b.ReportMetric(pairRate/echoRate, "pairs-per-echo-rt")
	b.ReportMetric(0, "ns/op")
}
