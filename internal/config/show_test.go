package config

import (
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// Show writes every key with where its value came from, never a secret,
// and is YAML that loads back to the same configuration (secrets aside).
func TestShowGivesEachValuesSourceAndNoSecret(t *testing.T) {
	const token, stripe, auth = "s3cr3t-admin-token-0123456789", "sk_live_0123456789abcdef", "libsql-auth-token-xyz"
	file := writeFile(t, "log_level: debug\nadmin:\n  token: "+token+"\nbilling:\n  enabled: true\n  stripe_secret_key: "+stripe+"\n")
	origins := map[string]string{}
	cfg, err := Load(Sources{File: file, Origins: origins, Workers: []WorkerKeys{digestKeys},
		Environ: []string{"APPVIEW_DATABASE_AUTH_TOKEN=" + auth, "APPVIEW_LEASES_TTL=20s"}, Sets: []string{"digest.interval=2h"}})
	if err != nil {
		t.Fatal(err)
	}
	out := Show(cfg, origins, file)
	for _, secret := range []string{token, stripe, auth} {
		if strings.Contains(out, secret) {
			t.Fatalf("Show wrote a secret:\n%s", out)
		}
	}
	for _, line := range []string{
		`instance_id: "` + cfg.InstanceID + `"`, "# generated",
		sampleLine(`log_level: "debug"`, file+":1") + "\n",
		"  token: " + Masked + "             # " + file + ":3\n",
		"  stripe_secret_key: " + Masked + " # " + file + ":6\n",
		"  auth_token: " + Masked + "        # APPVIEW_DATABASE_AUTH_TOKEN\n",
		"  ttl: 20s                      # APPVIEW_LEASES_TTL\n",
		"  renew_interval: 5s            # default\n",
		"  url: \"file:./data/appview.db\" # default\n",
		"  retry_schedule: [0s, 30s, 2m, 8m] # default\n",
		"\ndigest:\n  enabled: true                 # default\n  interval: 2h                  # --set\n",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("Show lacks %q:\n%s", line, out)
		}
	}
	// Every key is there, each with its source.
	keys := leafFields(reflect.ValueOf(&cfg).Elem(), "")
	if n := len(regexp.MustCompile(`(?m)^ *[a-z_]+: .* # `).FindAllString(out, -1)); n != len(keys) {
		t.Errorf("Show wrote %d keys with a source, the configuration has %d:\n%s", n, len(keys), out)
	}
	// YAML that loads back: the same configuration, secrets aside.
	back, err := Load(Sources{File: writeFile(t, strings.ReplaceAll(out, Masked, `"`+strings.Repeat("x", 16)+`"`)), Workers: []WorkerKeys{digestKeys}})
	if err != nil {
		t.Fatalf("Show's output does not load: %v\n%s", err, out)
	}
	back.Admin.Token, back.Billing.StripeSecretKey, back.Database.AuthToken = cfg.Admin.Token, cfg.Billing.StripeSecretKey, cfg.Database.AuthToken
	if !reflect.DeepEqual(back, cfg) {
		t.Errorf("Show's output loads to\n%+v\nwant\n%+v", back, cfg)
	}
}

// An empty instance_id in the file (as config init writes it) is
// replaced by a generated one, which is what config show names.
func TestShowNamesAGeneratedInstanceIDEvenWhenTheFileLeftItEmpty(t *testing.T) {
	file := writeFile(t, "instance_id: \"\"\n")
	origins := map[string]string{}
	cfg, err := Load(Sources{File: file, Origins: origins})
	if err != nil {
		t.Fatal(err)
	}
	out := Show(cfg, origins, file)
	line := regexp.MustCompile(`(?m)^instance_id: .*$`).FindString(out)
	if !strings.HasPrefix(line, `instance_id: "`+cfg.InstanceID+`"`) || !strings.HasSuffix(line, "# generated") {
		t.Errorf("config show says %q, want the generated %q # generated", line, cfg.InstanceID)
	}
}

// A key that holds a secret is tagged so: a new token or key is not
// shown by accident.
func TestEverySecretLookingKeyIsTaggedSecret(t *testing.T) {
	cfg := Default()
	secrets := map[string]bool{}
	var walk func(v reflect.Value, prefix string)
	walk = func(v reflect.Value, prefix string) {
		for _, f := range fieldsOf(v) {
			key := strings.TrimPrefix(prefix+"."+f.name, ".")
			if f.v.Kind() == reflect.Struct {
				walk(f.v, key)
			} else if f.secret {
				secrets[key] = true
			}
		}
	}
	walk(reflect.ValueOf(&cfg).Elem(), "")
	for key := range leafFields(reflect.ValueOf(&cfg).Elem(), "") {
		looks := regexp.MustCompile(`token|secret|password|_key$`).MatchString(key) && !strings.HasSuffix(key, "_file")
		if looks != secrets[key] {
			t.Errorf("%s: tagged secret %v, looks like a secret %v", key, secrets[key], looks)
		}
	}
	if len(secrets) != 3 {
		t.Errorf("secrets %v, want admin.token, database.auth_token and billing.stripe_secret_key", secrets)
	}
}
