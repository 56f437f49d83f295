/**
 * What the tests that run installed MCP clients in child processes share: the paths of those
 * clients and of the scripts that let them reach `*.localhost` Apps and sign in without a
 * desktop (test/oauth/real-clients-audit.test.ts; test/platform/third-party-clients.test.ts
 * defines the same four).
 */
import { fileURLToPath } from 'node:url'

const here = (path: string) => fileURLToPath(new URL(path, import.meta.url))

/** Preloaded with `node --import`: resolves `*.localhost` to the loopback address. */
export const RESOLVE_LOCALHOST = here('./resolve-localhost.mjs')
/** The `BROWSER` for mcp-remote's OAuth sign-in: follows the development authorization server's automatic sign-in. */
export const HEADLESS_BROWSER = here('./headless-browser.mjs')
/** mcp-remote, the stdio-to-HTTP bridge desktop hosts run. */
export const MCP_REMOTE = here('../../node_modules/mcp-remote/dist/proxy.js')
/** The MCP Inspector's CLI (`mcp-inspector --cli`). */
export const INSPECTOR_CLI = here('../../node_modules/@modelcontextprotocol/inspector/cli/build/cli.js')
