/**
 * `npm start`: serves the reference platform on PORT (default 8787).
 *
 *   npm start                       # examples/platform/seed.json
 *   npm start -- --seed my-seed.json
 */
import { readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { serve } from '@hono/node-server'
import { createPlatform } from './index.js'

const { values } = parseArgs({ options: { seed: { type: 'string' }, port: { type: 'string' } } })
const seedPath = values.seed ?? fileURLToPath(new URL('./seed.json', import.meta.url))
const port = Number(values.port ?? process.env.PORT ?? 8787)
const seed = JSON.parse(readFileSync(seedPath, 'utf8'))
const platform = createPlatform({
  seed,
  ...(process.env.AUTH_ISSUER && { authorizationServer: { issuer: process.env.AUTH_ISSUER } }),
})

const server = serve({
  port,
  hostname: process.env.HOST ?? '127.0.0.1',
  fetch: (request, env: { incoming?: { socket?: { remoteAddress?: string } } }) =>
    platform.fetch(request, { clientAddress: env.incoming?.socket?.remoteAddress }),
})

const [name, token] = Object.entries(platform.tokens)[0] ?? []
const app = seed.apps[0]
console.log(`mcp-dispatch reference platform on http://127.0.0.1:${port} (seed: ${seedPath})`)
for (const a of seed.apps) console.log(`  App ${a.slug}: http://${a.slug}.localhost:${port}/  (versions ${a.versions.map((v: string | { version: string }) => (typeof v === 'string' ? v : v.version)).join(', ')})`)
console.log(`  Token API: http://api.localhost:${port}/api/tokens`)
if (token && app) {
  console.log(`\nTry it (token "${name}"):\n`)
  console.log(
    `curl -s http://${app.slug}.localhost:${port}/v1 -H 'Authorization: Bearer ${token}' -H 'Content-Type: application/json' -d '{"jsonrpc":"2.0","id":1,"method":"tools/list"}' -D -`,
  )
}

const stop = () => {
  server.close()
  void platform.close().finally(() => process.exit(0))
}
process.on('SIGINT', stop)
process.on('SIGTERM', stop)
