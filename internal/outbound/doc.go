// Package outbound is how this process reaches other hosts:
//
//   - the guard every request to a host named by network data goes
//     through (netguard.go: no loopback or private address unless
//     network.allow_private, same-host redirects only);
//   - the rules every operator-given URL shares (urlcheck.go);
//   - Retry-After and RateLimit-Reset as peers send them (retryafter.go);
//   - a websocket dial that a cancelled context interrupts (wsdial.go).
package outbound
