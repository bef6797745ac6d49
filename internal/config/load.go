package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"sort"
	"strings"
	"syscall"

	"github.com/atcr-io/appview/internal/database"
)

// EnvPrefix starts every environment override (docs/spec.md §2).
const EnvPrefix = "APPVIEW_"

// Sources says where Load reads configuration from.
type Sources struct {
	// File is a YAML file path; empty means defaults only.
	File string
	// Environ is the environment as KEY=VALUE lines (os.Environ() in production).
	Environ []string
	// Sets are flag overrides as dotted-key=value (from --set), applied last.
	Sets []string
	// Warn receives one line for each APPVIEW_* variable that is not a
	// config key (see Load); nil drops them.
	Warn func(msg string)
	// Workers are the sections of the registered workers that own one
	// (cmd/appview's worker list): their keys exist only when given here.
	Workers []WorkerKeys
	// Origins, when not nil, receives where each key set from a source got
	// its value: "line 4" (of File), "from APPVIEW_LEASES_TTL", "from
	// --set"; a key left at its default has no entry. PointAt uses it for
	// refusals made after Load.
	Origins map[string]string
}

// Load builds the configuration from defaults, then Sources in order, and
// validates it. Its error is the first of the problems Check finds, a
// *Error naming the key (an unreadable file is one about "--config").
//
// The file and --set are strict: an unknown key is an error. The
// environment is shared with other tools, so an APPVIEW_* variable that
// names no key is not: a Kubernetes service link (APPVIEW_PORT=tcp://...,
// APPVIEW_SERVICE_HOST, APPVIEW_PORT_80_TCP_ADDR, ... for a Service named
// "appview") is ignored quietly, and anything else (a deploy script's
// APPVIEW_BIN) is ignored with a warning, naming the key it was probably
// meant to be when one is close.
func Load(src Sources) (Config, error) {
	cfg, problems := Check(src)
	return cfg, problems.Err()
}

// Check is Load reporting every problem instead of the first: each bad
// value of the file, the environment and --set, then every rule of
// Validate that the values break (one problem per key; a rule reading a
// key that already has a problem is skipped, since that key does not hold
// what the operator wrote). Each problem says where its value came from,
// as PointAt does. When the file cannot be read or is not one YAML
// document, the rules are not checked: what the file meant is unknown.
// It opens nothing but the file and admin.token_file.
func Check(src Sources) (Config, Problems) {
	cfg, declared := withWorkers(Default(), src.Workers)
	if len(declared) > 0 {
		return cfg, declared // a registration to fix, not a configuration
	}
	// origins says where each key set from a source got its value, so a
	// refusal of the value by Validate can point at it ("line 4", an
	// environment variable, --set).
	origins := src.Origins
	if origins == nil {
		origins = map[string]string{}
	}
	var p problemList
	fileRead := true
	if src.File != "" {
		data, err := readConfigFile(src.File)
		if err != nil {
			p.add(&Error{Key: "--config", Reason: err.Error()})
			fileRead = false
		} else {
			fileRead = decodeYAML(data, &cfg, origins, &p)
		}
	}
	leaves := leafFields(reflect.ValueOf(&cfg).Elem(), "")
	byEnv := make(map[string]string, len(leaves))
	for key := range leaves {
		byEnv[EnvName(key)] = key
	}
	for _, kv := range src.Environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, EnvPrefix) {
			continue
		}
		key, known := byEnv[name]
		if !known {
			if !isServiceLink(name, value) && src.Warn != nil {
				src.Warn(unknownEnvWarning(name, byEnv))
			}
			continue
		}
		if err := setFromString(leaves[key], key, value); err != nil {
			p.add(from(err, name))
			continue
		}
		origins[key] = "from " + name
	}
	for _, kv := range src.Sets {
		p.add(setFlag(kv, leaves, origins))
	}
	if cfg.InstanceID == "" {
		// An empty instance_id (the file config init writes has one) is
		// not the value in effect: config show says "generated".
		cfg.InstanceID = NewInstanceID()
		delete(origins, "instance_id")
	}
	p.add(PointAt(cfg.readTokenFile(), origins))
	if fileRead {
		for _, e := range cfg.Problems() {
			p.add(PointAt(e, origins))
		}
	}
	return cfg, p.list
}

// setFlag applies one --set key=value to its field in leaves.
func setFlag(kv string, leaves map[string]reflect.Value, origins map[string]string) error {
	key, value, ok := strings.Cut(kv, "=")
	if !ok || strings.TrimSpace(key) == "" {
		return keyErr(kv, "--set wants key=value")
	}
	if trimmed := strings.TrimSpace(key); trimmed != key {
		return keyErr(key, "--set key with spaces around it (write %s=...)", trimmed)
	}
	field, known := leaves[key]
	if !known {
		if sub := sectionKeys(key, leaves); len(sub) > 0 {
			return keyErr(key, "a section, not a value: set one of its keys (%s)", strings.Join(sub, ", "))
		}
		return keyErr(key, "unknown key%s (from --set)", suggestKey(key, leaves))
	}
	if err := setFromString(field, key, value); err != nil {
		return from(err, "--set")
	}
	origins[key] = "from --set"
	return nil
}

// PointAt adds to err, when it is or wraps a refusal (*Error) of a key
// set from a source, where its value came from, as Load's own refusals
// say: " (line 4)" of the file, " (from APPVIEW_LEASES_TTL)", " (from
// --set)"; origins is what Load put in Sources.Origins. It is for
// refusals made after Load, by what the value names: a port that cannot
// be bound, a database that cannot be opened. The result is the refusal
// itself (*Error), whatever wrapped it; err is returned as it is when it
// holds no *Error, names a key left at its default, or already says.
// Load's own refusals come through it too.
func PointAt(err error, origins map[string]string) error {
	var e *Error
	if !errors.As(err, &e) {
		return err
	}
	if strings.HasSuffix(e.Reason, ")") && (strings.Contains(e.Reason, " (line ") || strings.Contains(e.Reason, " (from ")) {
		return err
	}
	var parts []string
	if o, ok := origins[e.Key]; ok {
		parts = append(parts, o)
	}
	// A bound against another key (renew_deadline < leases.ttl) may be
	// broken by that key's override: name where it came from too. (Its
	// line in the file the operator can read there, unless the refused
	// key itself is at its default and the file set only the other: an
	// admin.token required by the admin.addr of line 8.)
	_, own := origins[e.Key]
	var others []string
	for k, o := range origins {
		if k == e.Key || !strings.Contains(e.Reason, k) {
			continue
		}
		switch {
		case strings.HasPrefix(o, "from "):
			others = append(others, k+" "+o)
		case !own:
			others = append(others, k+" at "+o)
		}
	}
	sort.Strings(others)
	parts = append(parts, others...)
	if len(parts) == 0 {
		return err
	}
	return &Error{Key: e.Key, Reason: e.Reason + " (" + strings.Join(parts, "; ") + ")"}
}

// from says where a bad value came from (an environment variable or
// --set), since it may override a file the operator is looking at.
func from(err error, source string) error {
	var e *Error
	if errors.As(err, &e) {
		return &Error{Key: e.Key, Reason: e.Reason + " (from " + source + ")"}
	}
	return err
}

// readConfigFile reads the --config file, at most MaxConfigFileBytes: a
// longer one (or one that never ends) is an error naming the bound.
// Errors name the file.
func readConfigFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxConfigFileBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes (1 MiB): not a configuration file", path, MaxConfigFileBytes)
	}
	return data, nil
}

// readTokenFile fills Admin.Token from Admin.TokenFile (a
// secrets mount). It refuses both set, an unreadable or oversized file,
// anything but a regular file (a directory, a FIFO, a device) and an
// empty token.
func (c *Config) readTokenFile() error {
	a := &c.Admin
	if a.TokenFile == "" {
		return nil
	}
	if a.Token != "" {
		return keyErr("admin.token_file", "set admin.token or admin.token_file, not both")
	}
	// Non-blocking, so a FIFO with no writer (a secrets mount not filled
	// yet) cannot hang the start past every signal; anything but a regular
	// file is refused once open.
	f, err := os.OpenFile(a.TokenFile, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return keyErr("admin.token_file", "%v", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return keyErr("admin.token_file", "%v", err)
	} else if !st.Mode().IsRegular() {
		return keyErr("admin.token_file", "%s is %s, not a regular file", a.TokenFile, database.FileKind(st.Mode()))
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxTokenFileBytes+1))
	if err != nil {
		return keyErr("admin.token_file", "%v", err) // names the op and the file already
	}
	if len(data) > MaxTokenFileBytes {
		return keyErr("admin.token_file", "%s is larger than %d bytes; it should hold only the token", a.TokenFile, MaxTokenFileBytes)
	}
	a.Token = strings.TrimSpace(string(data))
	if a.Token == "" {
		return keyErr("admin.token_file", "%s is empty", a.TokenFile)
	}
	return nil
}
