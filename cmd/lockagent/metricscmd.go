package main

import (
	"context"
	"fmt"
	"net"

	"github.com/hashicorp/go-hclog"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/metrics"
	"github.com/lockagent/lockagent/socketapi"
)

// listenMetrics opens the metrics endpoint's listener, if an address is
// configured: at start, so that a busy address stops the agent there.
func listenMetrics(addr string) (*metrics.Metrics, net.Listener, error) {
	if addr == "" {
		return nil, nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("metrics.address: %w", err)
	}
	return metrics.New(), ln, nil
}

// closeMetrics closes the listener of an endpoint that will not be served.
func closeMetrics(ln net.Listener) {
	if ln != nil {
		ln.Close()
	}
}

// observer is the agent's Observer: the metrics, or none.
func observer(m *metrics.Metrics) agent.Observer {
	if m == nil {
		return nil
	}
	return m
}

// serverObserver is what the socket server tells the metrics, if any.
func serverObserver(m *metrics.Metrics) socketapi.Observer {
	if m == nil {
		return nil
	}
	return m
}

// serveMetrics serves /metrics until ctx is done.
func serveMetrics(ctx context.Context, m *metrics.Metrics, ln net.Listener, log hclog.Logger) {
	log.Info("metrics served", "address", "http://"+ln.Addr().String()+"/metrics")
	if err := m.Serve(ctx, ln); err != nil {
		log.Error("metrics endpoint failed", "error", err)
	}
}
