#!/usr/bin/env node
/**
 * A headless stand-in for the browser that MCP clients on the command line open for OAuth
 * sign-in (mcp-remote, through the `open` package and its bundled `xdg-open`, which runs
 * `$BROWSER <url>` outside a desktop session): `headless-browser.mjs <authorization URL>`
 * follows the authorization server's redirects with a cookie jar, as a browser would, through
 * the development authorization server's automatic sign-in (examples/platform/dev-auth-server.ts),
 * and loads the URL it is finally sent to on another origin: the client's own callback, which
 * receives the code. Exits 0 once the callback answered 2xx, 1 otherwise (the reason on stderr).
 */
/* global fetch, URL, console */
import process from 'node:process'

const start = process.argv[2]
if (!start) {
  console.error('usage: headless-browser.mjs <url>')
  process.exit(2)
}
const authorizationServer = new URL(start).origin
const jar = new Map()
let next = start
for (let hop = 0; hop < 16; hop++) {
  const cookie = [...jar].map(([name, value]) => `${name}=${value}`).join('; ')
  const response = await fetch(next, { redirect: 'manual', headers: cookie ? { cookie } : {} })
  for (const line of response.headers.getSetCookie()) {
    const pair = line.split(';', 1)[0]
    const eq = pair.indexOf('=')
    jar.set(pair.slice(0, eq).trim(), pair.slice(eq + 1))
  }
  const text = await response.text()
  if (new URL(next).origin !== authorizationServer) {
    if (response.ok) process.exit(0)
    console.error(`headless-browser: the callback answered ${response.status}: ${text.slice(0, 300)}`)
    process.exit(1)
  }
  const location = response.headers.get('location')
  if (!location) {
    console.error(`headless-browser: sign-in stopped with ${response.status}: ${text.slice(0, 300)}`)
    process.exit(1)
  }
  next = new URL(location, next).href
}
console.error('headless-browser: too many redirects')
process.exit(1)
