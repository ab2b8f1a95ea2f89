package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	goredis "github.com/redis/go-redis/v9"

	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/backend/memory"
	"github.com/lockagent/lockagent/backend/redis"
	"github.com/lockagent/lockagent/config"
)

// openBackend opens the backend the configuration names.
func openBackend(ctx context.Context, cfg config.Config, log hclog.Logger) (backend.Backend, error) {
	if cfg.Backend.Kind != "redis" {
		b, err := memory.Open(cfg.StateDir)
		if err != nil {
			return nil, err
		}
		return b, nil
	}
	rc := cfg.Backend.Redis
	goredis.SetLogger(goredisLog{log.Named("go-redis")})
	opts := &goredis.UniversalOptions{
		Addrs:         rc.Addresses,
		MasterName:    rc.MasterName,
		IsClusterMode: rc.Cluster,
		Username:      rc.Username,
		DB:            rc.DB,
		ClientName:    "lockagent",
		// Deadlines come from the agent's contexts: a renewal never waits
		// past its lease's local deadline.
		ContextTimeoutEnabled: true,
		DialTimeout:           2 * time.Second,
		ReadTimeout:           3 * time.Second,
		MaxRetries:            2,
		// Pipelines (renewals, calls gathered while one is in flight) use
		// the connections that single calls keep warm: a connection of a
		// pool of their own would be dialed on first use, paying a
		// handshake of several round trips in the middle of a renewal.
		PipelinePoolSize: -1,
	}
	pw, err := redisPassword("", rc.PasswordFile, rc.PasswordCredential, os.Getenv)
	if err != nil {
		return nil, err
	}
	opts.Password = pw
	if rc.MasterName != "" {
		pw, err := redisPassword("sentinel_", rc.SentinelPasswordFile, rc.SentinelPasswordCredential, os.Getenv)
		if err != nil {
			return nil, err
		}
		opts.SentinelUsername, opts.SentinelPassword = rc.SentinelUsername, pw
	}
	if rc.TLS != nil {
		tc, err := tlsConfig(rc.TLS)
		if err != nil {
			return nil, err
		}
		opts.TLSConfig = tc
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := redis.Open(ctx, redis.Options{Client: goredis.NewUniversalClient(opts), KeyPrefix: rc.KeyPrefix, Logger: log,
		WaitReplicas: rc.WaitReplicas, WaitTimeout: rc.WaitTimeout})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// goredisLog passes go-redis's own log lines to the agent's logger, so
// that they follow log_level and log_format: a line that tells of a
// failure is a warning, any other (a new primary, a sentinel found) is
// information.
type goredisLog struct{ log hclog.Logger }

func (g goredisLog) Printf(_ context.Context, format string, v ...any) {
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	lower := strings.ToLower(msg)
	if strings.Contains(lower, "fail") || strings.Contains(lower, "error") || strings.Contains(lower, "panic") {
		g.log.Warn(msg)
		return
	}
	g.log.Info(msg)
}

// tlsConfig builds the client TLS settings from the configured files.
func tlsConfig(t *config.TLS) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("redis tls ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis tls ca_file %s: no certificate found", t.CAFile)
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("redis tls: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// redisPassword reads a password from a file (the setting prefix +
// "password_file") or from the systemd credential a setting prefix +
// "password_credential" names; none is "". A trailing newline is not part
// of it. Errors name the file, never its content.
func redisPassword(prefix, file, credential string, getenv func(string) string) (string, error) {
	path, field := file, prefix+"password_file"
	if credential != "" {
		dir := getenv("CREDENTIALS_DIRECTORY")
		if dir == "" {
			return "", fmt.Errorf("redis %spassword_credential %q: $CREDENTIALS_DIRECTORY is not set (LoadCredential= in the unit sets it)", prefix, credential)
		}
		path, field = filepath.Join(dir, credential), prefix+"password_credential"
	}
	if path == "" {
		return "", nil
	}
	pw, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("redis %s: %w", field, err)
	}
	return strings.TrimRight(string(pw), "\r\n"), nil
}
