package config

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// decoder walks the HCL body, decoding each attribute into the Config and
// recording where each field was written so that problems found later point
// into the file.
type decoder struct {
	file   string
	errs   []posError
	ranges map[string]hcl.Range // field path -> its value, or its block's header
}

type posError struct {
	rng hcl.Range
	err error
}

// err joins the errors in file order, each prefixed with its position.
func (d *decoder) err() error {
	slices.SortStableFunc(d.errs, func(a, b posError) int {
		return cmpPos(a.rng.Start, b.rng.Start)
	})
	errs := make([]error, len(d.errs))
	for i, e := range d.errs {
		if e.rng.Start.Line == 0 {
			errs[i] = fmt.Errorf("%s: %w", d.file, e.err)
		} else {
			errs[i] = fmt.Errorf("%s:%d,%d: %w", e.rng.Filename, e.rng.Start.Line, e.rng.Start.Column, e.err)
		}
	}
	return errors.Join(errs...)
}

func cmpPos(a, b hcl.Pos) int {
	if a.Line != b.Line {
		return a.Line - b.Line
	}
	return a.Column - b.Column
}

func (d *decoder) failf(field string, rng hcl.Range, format string, args ...any) {
	d.errs = append(d.errs, posError{rng, newFieldError(field, format, args...)})
}

// diags records HCL's error diagnostics under field and reports whether
// there were any.
func (d *decoder) diags(field string, diags hcl.Diagnostics) bool {
	for _, diag := range diags {
		if diag.Severity != hcl.DiagError {
			continue
		}
		msg := lowerFirst(diag.Summary)
		if diag.Detail != "" {
			msg += ": " + lowerFirst(strings.TrimSuffix(diag.Detail, "."))
		}
		rng := hcl.Range{Filename: d.file}
		if diag.Subject != nil {
			rng = *diag.Subject
		}
		var err error = errors.New(msg)
		if field != "" {
			err = &fieldError{field, err}
		}
		d.errs = append(d.errs, posError{rng, err})
	}
	return diags.HasErrors()
}

// lowerFirst makes HCL's capitalized messages read like the rest, leaving
// acronyms alone.
func lowerFirst(s string) string {
	if s == "" {
		return s
	}
	r, n := utf8.DecodeRuneInString(s)
	if next, _ := utf8.DecodeRuneInString(s[n:]); unicode.IsUpper(next) {
		return s
	}
	return string(unicode.ToLower(r)) + s[n:]
}

// rangeOf finds where field was written, falling back to the closest
// enclosing block; the zero Range when the field comes from the defaults.
func (d *decoder) rangeOf(field string) hcl.Range {
	for f := field; f != ""; {
		if rng, ok := d.ranges[f]; ok {
			return rng
		}
		i := strings.LastIndexAny(f, ".[")
		if i < 0 {
			break
		}
		f = f[:i]
	}
	return hcl.Range{}
}

// block decodes b's body against the schema made of attrs and blocks,
// recording b's position under field.
func (d *decoder) block(field string, b *hcl.Block, attrs []string, blocks ...hcl.BlockHeaderSchema) *hcl.BodyContent {
	d.ranges[field] = b.DefRange
	return d.content(field, b.Body, attrs, blocks...)
}

func (d *decoder) content(field string, body hcl.Body, attrs []string, blocks ...hcl.BlockHeaderSchema) *hcl.BodyContent {
	schema := &hcl.BodySchema{Blocks: blocks}
	for _, a := range attrs {
		schema.Attributes = append(schema.Attributes, hcl.AttributeSchema{Name: a})
	}
	content, diags := body.Content(schema)
	d.diags(field, diags)
	return content
}

// unique indexes blocks by type, rejecting a type given twice.
func (d *decoder) unique(prefix string, blocks hcl.Blocks) map[string]*hcl.Block {
	m := map[string]*hcl.Block{}
	for _, b := range blocks {
		if first := m[b.Type]; first != nil {
			d.failf(prefix+b.Type, b.DefRange, "only one such block is allowed; the first is at line %d", first.DefRange.Start.Line)
			continue
		}
		m[b.Type] = b
	}
	return m
}

func (d *decoder) root(body hcl.Body, c *Config) {
	content := d.content("", body, []string{"state_dir", "log_level", "log_format"},
		hcl.BlockHeaderSchema{Type: "socket"},
		hcl.BlockHeaderSchema{Type: "backend", LabelNames: []string{"kind"}},
		hcl.BlockHeaderSchema{Type: "leases"},
		hcl.BlockHeaderSchema{Type: "limits"},
		hcl.BlockHeaderSchema{Type: "acl"},
		hcl.BlockHeaderSchema{Type: "metrics"},
	)
	a := content.Attributes
	d.str("state_dir", a["state_dir"], &c.StateDir)
	d.str("log_level", a["log_level"], &c.LogLevel)
	d.str("log_format", a["log_format"], &c.LogFormat)

	blocks := d.unique("", content.Blocks)
	if b := blocks["socket"]; b != nil {
		a := d.block("socket", b, []string{"path", "mode", "group"}).Attributes
		d.str("socket.path", a["path"], &c.Socket.Path)
		d.mode("socket.mode", a["mode"], &c.Socket.Mode)
		if attr := a["group"]; attr != nil {
			if v, ok := d.eval("socket.group", attr); ok {
				d.group("socket.group", attr.Expr.Range(), v, &c.Socket.Group)
			}
		}
	}
	if b := blocks["backend"]; b != nil {
		d.backend(b, &c.Backend)
	}
	if b := blocks["leases"]; b != nil {
		a := d.block("leases", b, []string{"default_ttl", "min_ttl", "max_ttl"}).Attributes
		d.duration("leases.default_ttl", a["default_ttl"], &c.Leases.DefaultTTL)
		d.duration("leases.min_ttl", a["min_ttl"], &c.Leases.MinTTL)
		d.duration("leases.max_ttl", a["max_ttl"], &c.Leases.MaxTTL)
	}
	if b := blocks["limits"]; b != nil {
		a := d.block("limits", b, []string{"max_sessions", "max_leases_per_session", "max_waiters", "max_line_bytes",
			"max_connections_per_uid", "max_sessions_per_uid", "max_leases_per_uid",
			"max_output_bytes", "max_output_bytes_per_uid"}).Attributes
		d.integer("limits.max_sessions", a["max_sessions"], &c.Limits.MaxSessions)
		d.integer("limits.max_leases_per_session", a["max_leases_per_session"], &c.Limits.MaxLeasesPerSession)
		d.integer("limits.max_waiters", a["max_waiters"], &c.Limits.MaxWaiters)
		d.integer("limits.max_line_bytes", a["max_line_bytes"], &c.Limits.MaxLineBytes)
		d.integer("limits.max_connections_per_uid", a["max_connections_per_uid"], &c.Limits.MaxConnectionsPerUID)
		d.integer("limits.max_sessions_per_uid", a["max_sessions_per_uid"], &c.Limits.MaxSessionsPerUID)
		d.integer("limits.max_leases_per_uid", a["max_leases_per_uid"], &c.Limits.MaxLeasesPerUID)
		d.integer("limits.max_output_bytes", a["max_output_bytes"], &c.Limits.MaxOutputBytes)
		d.integer("limits.max_output_bytes_per_uid", a["max_output_bytes_per_uid"], &c.Limits.MaxOutputBytesPerUID)
	}
	if b := blocks["acl"]; b != nil {
		c.ACL = d.acl(b)
	}
	if b := blocks["metrics"]; b != nil {
		a := d.block("metrics", b, []string{"address"}).Attributes
		d.str("metrics.address", a["address"], &c.Metrics.Address)
	}
}

func (d *decoder) backend(b *hcl.Block, be *Backend) {
	d.ranges["backend"] = b.DefRange
	kind := b.Labels[0]
	field := fmt.Sprintf("backend %q", kind)
	switch kind {
	case "memory":
		d.block(field, b, nil)
		*be = Backend{Kind: "memory"}
	case "redis":
		content := d.block(field, b, []string{"addresses", "master_name", "cluster", "username", "password", "password_file", "password_credential", "sentinel_username", "sentinel_password", "sentinel_password_file", "sentinel_password_credential", "db", "key_prefix", "wait_replicas", "wait_timeout"},
			hcl.BlockHeaderSchema{Type: "tls"})
		a := content.Attributes
		for _, pw := range []string{"password", "sentinel_password"} {
			if attr := a[pw]; attr != nil {
				// Listed in the schema only to explain why it is refused.
				d.failf(field+"."+pw, attr.NameRange, "a password is never written in the config; put it in a file and set %[1]s_file, or in a systemd credential and set %[1]s_credential", pw)
			}
		}
		r := &Redis{KeyPrefix: "lockagent", WaitTimeout: defaultWaitTimeout}
		d.strs(field+".addresses", a["addresses"], &r.Addresses)
		d.str(field+".master_name", a["master_name"], &r.MasterName)
		d.boolean(field+".cluster", a["cluster"], &r.Cluster)
		d.str(field+".username", a["username"], &r.Username)
		d.str(field+".password_file", a["password_file"], &r.PasswordFile)
		d.str(field+".password_credential", a["password_credential"], &r.PasswordCredential)
		d.str(field+".sentinel_username", a["sentinel_username"], &r.SentinelUsername)
		d.str(field+".sentinel_password_file", a["sentinel_password_file"], &r.SentinelPasswordFile)
		d.str(field+".sentinel_password_credential", a["sentinel_password_credential"], &r.SentinelPasswordCredential)
		d.integer(field+".db", a["db"], &r.DB)
		d.str(field+".key_prefix", a["key_prefix"], &r.KeyPrefix)
		d.integer(field+".wait_replicas", a["wait_replicas"], &r.WaitReplicas)
		d.duration(field+".wait_timeout", a["wait_timeout"], &r.WaitTimeout)
		if tb := d.unique(field+".", content.Blocks)["tls"]; tb != nil {
			r.TLS = d.tls(field, tb)
		}
		*be = Backend{Kind: "redis", Redis: r}
	case "etcd":
		content := d.block(field, b, []string{"endpoints", "key_prefix", "username", "password", "password_file", "password_credential", "dial_timeout", "request_timeout"},
			hcl.BlockHeaderSchema{Type: "tls"})
		a := content.Attributes
		if attr := a["password"]; attr != nil {
			// Listed in the schema only to explain why it is refused.
			d.failf(field+".password", attr.NameRange, "a password is never written in the config; put it in a file and set password_file, or in a systemd credential and set password_credential")
		}
		e := &Etcd{KeyPrefix: "lockagent", DialTimeout: defaultEtcdTimeout, RequestTimeout: defaultEtcdTimeout}
		d.strs(field+".endpoints", a["endpoints"], &e.Endpoints)
		d.str(field+".key_prefix", a["key_prefix"], &e.KeyPrefix)
		d.str(field+".username", a["username"], &e.Username)
		d.str(field+".password_file", a["password_file"], &e.PasswordFile)
		d.str(field+".password_credential", a["password_credential"], &e.PasswordCredential)
		d.duration(field+".dial_timeout", a["dial_timeout"], &e.DialTimeout)
		d.duration(field+".request_timeout", a["request_timeout"], &e.RequestTimeout)
		if tb := d.unique(field+".", content.Blocks)["tls"]; tb != nil {
			e.TLS = d.tls(field, tb)
		}
		*be = Backend{Kind: "etcd", Etcd: e}
	default:
		d.failf("backend", b.LabelRanges[0], "unknown kind %q; want memory, redis or etcd", kind)
	}
}

// tls decodes the tls block of a backend's block.
func (d *decoder) tls(field string, b *hcl.Block) *TLS {
	a := d.block(field+".tls", b, []string{"ca_file", "cert_file", "key_file"}).Attributes
	t := &TLS{}
	d.str(field+".tls.ca_file", a["ca_file"], &t.CAFile)
	d.str(field+".tls.cert_file", a["cert_file"], &t.CertFile)
	d.str(field+".tls.key_file", a["key_file"], &t.KeyFile)
	return t
}

func (d *decoder) acl(b *hcl.Block) *ACL {
	content := d.block("acl", b, []string{"admin_uids", "admin_groups"},
		hcl.BlockHeaderSchema{Type: "rule", LabelNames: []string{"pattern"}})
	acl := &ACL{}
	d.uids("acl.admin_uids", content.Attributes["admin_uids"], &acl.AdminUIDs)
	d.groups("acl.admin_groups", content.Attributes["admin_groups"], &acl.AdminGroups)
	first := map[string]*hcl.Block{}
	for _, rb := range content.Blocks {
		pattern := rb.Labels[0]
		field := rulePath(pattern)
		if f := first[pattern]; f != nil {
			d.failf(field, rb.LabelRanges[0], "duplicate rule; the first is at line %d", f.DefRange.Start.Line)
			continue
		}
		first[pattern] = rb
		a := d.block(field, rb, []string{"uids", "groups", "modes"}).Attributes
		rule := Rule{Pattern: pattern}
		d.uids(field+".uids", a["uids"], &rule.UIDs)
		d.groups(field+".groups", a["groups"], &rule.Groups)
		d.strs(field+".modes", a["modes"], &rule.Modes)
		acl.Rules = append(acl.Rules, rule)
	}
	return acl
}

// eval evaluates attr, which may use neither variables nor functions, and
// records its position under field.
func (d *decoder) eval(field string, attr *hcl.Attribute) (cty.Value, bool) {
	d.ranges[field] = attr.Expr.Range()
	v, diags := attr.Expr.Value(nil)
	if d.diags(field, diags) {
		return cty.NilVal, false
	}
	return v, true
}

// str decodes a string attribute into dst and reports whether it did.
func (d *decoder) str(field string, attr *hcl.Attribute, dst *string) bool {
	if attr == nil {
		return false
	}
	v, ok := d.eval(field, attr)
	if !ok {
		return false
	}
	if v.IsNull() || v.Type() != cty.String {
		d.failf(field, attr.Expr.Range(), "must be a string")
		return false
	}
	*dst = v.AsString()
	return true
}

func (d *decoder) duration(field string, attr *hcl.Attribute, dst *time.Duration) {
	var s string
	if !d.str(field, attr, &s) {
		return
	}
	dur, err := time.ParseDuration(s)
	if err != nil {
		d.failf(field, attr.Expr.Range(), "%q is not a duration", s)
		return
	}
	*dst = dur
}

func (d *decoder) mode(field string, attr *hcl.Attribute, dst *os.FileMode) {
	var s string
	if !d.str(field, attr, &s) {
		return
	}
	n, err := strconv.ParseUint(s, 8, 32)
	if err != nil {
		d.failf(field, attr.Expr.Range(), `%q is not an octal mode like "0660"`, s)
		return
	}
	*dst = os.FileMode(n)
}

func (d *decoder) integer(field string, attr *hcl.Attribute, dst *int) {
	if attr == nil {
		return
	}
	v, ok := d.eval(field, attr)
	if !ok {
		return
	}
	n, ok := wholeNumber(v, math.MinInt, math.MaxInt)
	if !ok {
		d.failf(field, attr.Expr.Range(), "must be a whole number")
		return
	}
	*dst = int(n)
}

func (d *decoder) boolean(field string, attr *hcl.Attribute, dst *bool) {
	if attr == nil {
		return
	}
	v, ok := d.eval(field, attr)
	if !ok {
		return
	}
	if v.IsNull() || v.Type() != cty.Bool {
		d.failf(field, attr.Expr.Range(), "must be true or false")
		return
	}
	*dst = v.True()
}

// list decodes a list attribute, calling each for every element with the
// element's field path and position. The result of an empty list is an empty
// slice, not nil.
func (d *decoder) list(field string, attr *hcl.Attribute, each func(field string, rng hcl.Range, v cty.Value)) bool {
	if attr == nil {
		return false
	}
	v, ok := d.eval(field, attr)
	if !ok {
		return false
	}
	if v.IsNull() || !(v.Type().IsTupleType() || v.Type().IsListType()) {
		d.failf(field, attr.Expr.Range(), "must be a list")
		return false
	}
	tuple, _ := attr.Expr.(*hclsyntax.TupleConsExpr)
	for i, elem := range v.AsValueSlice() {
		rng := attr.Expr.Range()
		if tuple != nil && i < len(tuple.Exprs) {
			rng = tuple.Exprs[i].Range()
		}
		elemField := fmt.Sprintf("%s[%d]", field, i)
		d.ranges[elemField] = rng
		each(elemField, rng, elem)
	}
	return true
}

func (d *decoder) strs(field string, attr *hcl.Attribute, dst *[]string) {
	out := []string{}
	if d.list(field, attr, func(field string, rng hcl.Range, v cty.Value) {
		if v.IsNull() || v.Type() != cty.String {
			d.failf(field, rng, "must be a string")
			return
		}
		out = append(out, v.AsString())
	}) {
		*dst = out
	}
}

func (d *decoder) uids(field string, attr *hcl.Attribute, dst *[]uint32) {
	out := []uint32{}
	if d.list(field, attr, func(field string, rng hcl.Range, v cty.Value) {
		n, ok := wholeNumber(v, 0, math.MaxUint32)
		if !ok {
			d.failf(field, rng, "must be a uid, a whole number from 0 to %d", uint32(math.MaxUint32))
			return
		}
		out = append(out, uint32(n))
	}) {
		*dst = out
	}
}

func (d *decoder) groups(field string, attr *hcl.Attribute, dst *[]string) {
	out := []string{}
	if d.list(field, attr, func(field string, rng hcl.Range, v cty.Value) {
		var g string
		d.group(field, rng, v, &g)
		out = append(out, g)
	}) {
		*dst = out
	}
}

// group decodes a group given by name (a string) or by gid (a string or a
// number).
func (d *decoder) group(field string, rng hcl.Range, v cty.Value, dst *string) {
	if !v.IsNull() && v.Type() == cty.String {
		*dst = v.AsString()
		return
	}
	n, ok := wholeNumber(v, 0, math.MaxUint32)
	if !ok {
		d.failf(field, rng, "must be a group name or gid")
		return
	}
	*dst = strconv.FormatInt(n, 10)
}

// wholeNumber returns v as an integer when it is a number without a fraction
// within [lo, hi].
func wholeNumber(v cty.Value, lo, hi int64) (int64, bool) {
	if v.IsNull() || v.Type() != cty.Number {
		return 0, false
	}
	n, acc := v.AsBigFloat().Int64()
	return n, acc == big.Exact && n >= lo && n <= hi
}
