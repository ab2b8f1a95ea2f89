package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Render returns c as an HCL config file, in the layout of the documented
// example, with every value spelled out: loading the text gives back c.
func (c Config) Render() string {
	var b strings.Builder
	b.WriteString("socket {\n")
	attrs(&b, "  ", "path", quote(c.Socket.Path), "mode", fmt.Sprintf(`"%04o"`, uint32(c.Socket.Mode)), "group", quote(c.Socket.Group))
	b.WriteString("}\n\n")
	attrs(&b, "", "state_dir", quote(c.StateDir), "log_level", quote(c.LogLevel), "log_format", quote(c.LogFormat))
	b.WriteString("\n")

	if r := c.Backend.Redis; r != nil {
		fmt.Fprintf(&b, "backend %s {\n", quote(c.Backend.Kind))
		attrs(&b, "  ",
			"addresses", list(r.Addresses, quote),
			"master_name", quote(r.MasterName),
			"cluster", strconv.FormatBool(r.Cluster),
			"username", quote(r.Username),
			"password_file", quote(r.PasswordFile),
			"password_credential", quote(r.PasswordCredential),
			"sentinel_username", quote(r.SentinelUsername),
			"sentinel_password_file", quote(r.SentinelPasswordFile),
			"sentinel_password_credential", quote(r.SentinelPasswordCredential),
			"db", strconv.Itoa(r.DB),
			"key_prefix", quote(r.KeyPrefix),
			"wait_replicas", strconv.Itoa(r.WaitReplicas),
			"wait_timeout", quote(formatDuration(r.WaitTimeout)))
		renderTLS(&b, r.TLS)
		b.WriteString("}\n\n")
	} else if e := c.Backend.Etcd; e != nil {
		fmt.Fprintf(&b, "backend %s {\n", quote(c.Backend.Kind))
		attrs(&b, "  ",
			"endpoints", list(e.Endpoints, quote),
			"key_prefix", quote(e.KeyPrefix),
			"username", quote(e.Username),
			"password_file", quote(e.PasswordFile),
			"password_credential", quote(e.PasswordCredential),
			"dial_timeout", quote(formatDuration(e.DialTimeout)),
			"request_timeout", quote(formatDuration(e.RequestTimeout)))
		renderTLS(&b, e.TLS)
		b.WriteString("}\n\n")
	} else {
		fmt.Fprintf(&b, "backend %s {}\n\n", quote(c.Backend.Kind))
	}

	b.WriteString("leases {\n")
	attrs(&b, "  ",
		"default_ttl", quote(formatDuration(c.Leases.DefaultTTL)),
		"min_ttl", quote(formatDuration(c.Leases.MinTTL)),
		"max_ttl", quote(formatDuration(c.Leases.MaxTTL)))
	b.WriteString("}\n\n")

	b.WriteString("limits {\n")
	attrs(&b, "  ",
		"max_sessions", strconv.Itoa(c.Limits.MaxSessions),
		"max_leases_per_session", strconv.Itoa(c.Limits.MaxLeasesPerSession),
		"max_waiters", strconv.Itoa(c.Limits.MaxWaiters),
		"max_line_bytes", strconv.Itoa(c.Limits.MaxLineBytes),
		"max_connections_per_uid", strconv.Itoa(c.Limits.MaxConnectionsPerUID),
		"max_sessions_per_uid", strconv.Itoa(c.Limits.MaxSessionsPerUID),
		"max_leases_per_uid", strconv.Itoa(c.Limits.MaxLeasesPerUID),
		"max_output_bytes", strconv.Itoa(c.Limits.MaxOutputBytes),
		"max_output_bytes_per_uid", strconv.Itoa(c.Limits.MaxOutputBytesPerUID))
	b.WriteString("}\n\n")

	if a := c.ACL; a != nil {
		b.WriteString("acl {\n")
		var kv []string
		if a.AdminUIDs != nil {
			kv = append(kv, "admin_uids", list(a.AdminUIDs, formatUID))
		}
		if a.AdminGroups != nil {
			kv = append(kv, "admin_groups", list(a.AdminGroups, quote))
		}
		attrs(&b, "  ", kv...)
		for i, r := range a.Rules {
			if i > 0 || len(kv) > 0 {
				b.WriteString("\n")
			}
			var ruleKV []string
			if r.UIDs != nil {
				ruleKV = append(ruleKV, "uids", list(r.UIDs, formatUID))
			}
			if r.Groups != nil {
				ruleKV = append(ruleKV, "groups", list(r.Groups, quote))
			}
			if r.Modes != nil {
				ruleKV = append(ruleKV, "modes", list(r.Modes, quote))
			}
			if len(ruleKV) == 0 {
				fmt.Fprintf(&b, "  rule %s {}\n", quote(r.Pattern))
				continue
			}
			fmt.Fprintf(&b, "  rule %s {\n", quote(r.Pattern))
			attrs(&b, "    ", ruleKV...)
			b.WriteString("  }\n")
		}
		b.WriteString("}\n\n")
	} else {
		b.WriteString("# no acl: whoever can open the socket may lock any name\n\n")
	}

	if c.Metrics.Address != "" {
		b.WriteString("metrics {\n")
		attrs(&b, "  ", "address", quote(c.Metrics.Address))
		b.WriteString("}\n")
	} else {
		b.WriteString("# no metrics: the endpoint is off\n")
	}
	return b.String()
}

// renderTLS writes a backend's tls block, if it has one.
func renderTLS(b *strings.Builder, t *TLS) {
	if t == nil {
		return
	}
	b.WriteString("\n  tls {\n")
	attrs(b, "    ", "ca_file", quote(t.CAFile), "cert_file", quote(t.CertFile), "key_file", quote(t.KeyFile))
	b.WriteString("  }\n")
}

// attrs writes name = value lines, kv alternating names and rendered values,
// with the equals signs aligned.
func attrs(b *strings.Builder, indent string, kv ...string) {
	width := 0
	for i := 0; i < len(kv); i += 2 {
		width = max(width, len(kv[i]))
	}
	for i := 0; i < len(kv); i += 2 {
		fmt.Fprintf(b, "%s%-*s = %s\n", indent, width, kv[i], kv[i+1])
	}
}

func list[T any](items []T, format func(T) string) string {
	parts := make([]string, len(items))
	for i, item := range items {
		parts[i] = format(item)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func formatUID(uid uint32) string { return strconv.FormatUint(uint64(uid), 10) }

// formatDuration is time.Duration.String without zero trailing units:
// "24h", not "24h0m0s". Both parse to the same duration.
func formatDuration(d time.Duration) string {
	s := d.String()
	s, ok := strings.CutSuffix(s, "m0s")
	if !ok {
		return s
	}
	if h, ok := strings.CutSuffix(s, "h0"); ok {
		return h + "h"
	}
	return s + "m"
}

// quote returns s as an HCL quoted string. Unlike strconv.Quote it escapes
// the template introducers "${" and "%{", and uses only HCL's escapes.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case (r == '$' || r == '%') && strings.HasPrefix(s[i+1:], "{"):
			b.WriteRune(r)
			b.WriteRune(r)
		case unicode.IsControl(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
