import { dirname, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

// The repository root: the app imports the built package (../../dist, through tsconfig.json's
// `paths`) and the MCP SDK from the root's node_modules, both outside this folder.
const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..')

/** @type {import('next').NextConfig} */
export default {
  turbopack: { root },
  outputFileTracingRoot: root,
  // `/v1/` is served as on the other adapters, not redirected to `/v1` (308).
  skipTrailingSlashRedirect: true,
}
