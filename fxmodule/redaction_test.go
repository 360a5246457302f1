package fxmodule_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/millpond/millpond/fxmodule"
)

// TestConfigsNeverShowTheirPasswords: an application that prints or logs
// its Config or RelayConfig (fmt, log/slog, zap) sees the database and
// NATS addresses with their passwords hidden.
func TestConfigsNeverShowTheirPasswords(t *testing.T) {
	const dbSecret, natsSecret = "db-Pw-SECRET-7731", "nats-Pw-SECRET-7731"
	values := map[string]any{
		"Config URL":       fxmodule.Config{DatabaseURL: "postgres://app:" + dbSecret + "@db.internal:5432/app", AutoMigrate: true},
		"Config key=value": fxmodule.Config{DatabaseURL: "host=db.internal user=app password=" + dbSecret + " dbname=app"},
		"Config mysql":     fxmodule.Config{DatabaseURL: "mysql://app:" + dbSecret + "@db.internal:3306/app"},
		"RelayConfig":      fxmodule.RelayConfig{NATSURL: "nats://relay:" + natsSecret + "@nats.internal:4222,nats://relay:" + natsSecret + "@nats2.internal:4222"},
	}
	for name, v := range values {
		var outputs []string
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%d", "%x", "%X", "%q", "%-10v", "%10.4v", "%t"} {
			outputs = append(outputs, fmt.Sprintf(verb, v))
		}
		outputs = append(outputs, fmt.Sprint(v), fmt.Sprintf("%v", []any{v}))
		switch c := v.(type) {
		case fxmodule.Config:
			outputs = append(outputs, fmt.Sprintf("%v %+v %#v", &c, &c, &c))
		case fxmodule.RelayConfig:
			outputs = append(outputs, fmt.Sprintf("%v %+v %#v", &c, &c, &c))
		}
		for _, h := range []func(*bytes.Buffer) slog.Handler{
			func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
			func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
		} {
			var buf bytes.Buffer
			slog.New(h(&buf)).Info("config", "config", v)
			outputs = append(outputs, buf.String())
		}
		var buf bytes.Buffer
		enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
		zap.New(zapcore.NewCore(enc, zapcore.AddSync(&buf), zap.DebugLevel)).Info("config", zap.Any("config", v))
		outputs = append(outputs, buf.String())
		for i, out := range outputs {
			if strings.Contains(out, "SECRET") {
				t.Errorf("%s: output %d shows a password: %s", name, i, out)
			}
			if i != 9 && !strings.Contains(out, "internal") { // 9: %10.4v cuts at 4
				t.Errorf("%s: output %d hides the host too: %s", name, i, out)
			}
		}
	}
}

// TestConfigFormatKeepsWidth: Format keeps the width and precision that fmt
// applied to String's result (%-20.8v of a Config in a table column).
func TestConfigFormatKeepsWidth(t *testing.T) {
	c, r := fxmodule.Config{DatabaseURL: "sqlite:x.db"}, fxmodule.RelayConfig{NATSURL: "nats://h:4222"}
	for _, got := range []struct{ got, want string }{
		{fmt.Sprintf("%-20.8v|", c), fmt.Sprintf("%-20.8s|", c.String())},
		{fmt.Sprintf("%-20.8v|", r), fmt.Sprintf("%-20.8s|", r.String())},
	} {
		if got.got != got.want {
			t.Errorf("%q, want %q", got.got, got.want)
		}
	}
}

// TestConfigsMarshalWithoutTheirPasswords: a Config or RelayConfig marshalled
// as JSON, on its own or inside an application's own configuration (which
// slog's JSON handler and zap's reflection encoder marshal field by field,
// past String and LogValue), shows no password.
func TestConfigsMarshalWithoutTheirPasswords(t *testing.T) {
	const dbSecret, natsSecret = "db-Pw-SECRET-7731", "nats-Pw-SECRET-7731"
	type appConfig struct {
		Name  string
		DB    fxmodule.Config
		Relay fxmodule.RelayConfig
	}
	app := appConfig{Name: "orders",
		DB:    fxmodule.Config{DatabaseURL: "postgres://app:" + dbSecret + "@db.internal:5432/app"},
		Relay: fxmodule.RelayConfig{NATSURL: "nats://relay:" + natsSecret + "@nats.internal:4222"}}
	var outputs []string
	for _, v := range []any{app.DB, app.Relay, &app.DB, &app.Relay, app, []fxmodule.RelayConfig{app.Relay}} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Errorf("json.Marshal(%T): %v", v, err)
		}
		outputs = append(outputs, string(b))
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("config", "app", app)
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	zap.New(zapcore.NewCore(enc, zapcore.AddSync(&buf), zap.DebugLevel)).Info("config",
		zap.Any("app", app), zap.Reflect("relay", app.Relay), zap.Reflect("db", app.DB))
	outputs = append(outputs, buf.String())
	for i, out := range outputs {
		if strings.Contains(out, "SECRET") {
			t.Errorf("output %d shows a password: %s", i, out)
		}
		if !strings.Contains(out, "internal") {
			t.Errorf("output %d hides the host too: %s", i, out)
		}
	}
}
