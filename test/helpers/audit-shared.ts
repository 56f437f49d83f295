/**
 * What the tests that run installed MCP clients in child processes share: the paths of those
 * clients and of the scripts that let them reach `*.localhost` Apps and sign in without a
 * desktop (test/oauth/real-clients-audit.test.ts, test/platform/third-party-clients.test.ts).
 */
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'

const here = (path: string) => fileURLToPath(new URL(path, import.meta.url))

/** Preloaded with `node --import`: resolves `*.localhost` to the loopback address. */
export const RESOLVE_LOCALHOST = here('./resolve-localhost.mjs')
/** The `BROWSER` for mcp-remote's OAuth sign-in: follows the development authorization server's automatic sign-in. */
export const HEADLESS_BROWSER = here('./headless-browser.mjs')
/** mcp-remote, the stdio-to-HTTP bridge desktop hosts run. */
export const MCP_REMOTE = here('../../node_modules/mcp-remote/dist/proxy.js')
/** The MCP Inspector's CLI (`mcp-inspector --cli`). */
export const INSPECTOR_CLI = here('../../node_modules/@modelcontextprotocol/inspector/cli/build/cli.js')

/**
 * What `xdg-open` reads to find a desktop session (and, finding one, opens the real browser
 * instead of `$BROWSER`): left out of the environment of a client signing in headless.
 */
const DESKTOP_VARIABLES = new Set([
  'DISPLAY',
  'WAYLAND_DISPLAY',
  'XDG_CURRENT_DESKTOP',
  'XDG_SESSION_DESKTOP',
  'DESKTOP_SESSION',
  'KDE_FULL_SESSION',
  'KDE_SESSION_VERSION',
  'GNOME_DESKTOP_SESSION_ID',
  'MATE_DESKTOP_SESSION_ID',
  'DBUS_SESSION_BUS_ADDRESS',
])

/** `env` without a desktop session, so `xdg-open` turns to `$BROWSER` ({@link HEADLESS_BROWSER}). */
export function withoutDesktop(env: NodeJS.ProcessEnv, drop: (name: string) => boolean = () => false): Record<string, string> {
  return Object.fromEntries(Object.entries(env).filter((entry): entry is [string, string] => entry[1] !== undefined && !DESKTOP_VARIABLES.has(entry[0]) && !drop(entry[0])))
}

/** An SDK stdio client connected through mcp-remote signing in with OAuth: see {@link connectMcpRemoteOAuth}. */
export interface McpRemoteOAuth {
  readonly client: Client
  /** What mcp-remote printed on stderr so far. */
  stderr(): string
  /** Closes the client (mcp-remote with it) and removes mcp-remote's config directory. */
  close(): Promise<void>
}

/**
 * Starts mcp-remote for `url` without `--header`, so it signs in with OAuth through
 * {@link HEADLESS_BROWSER} (no desktop session: its bundled `xdg-open` turns to `$BROWSER`),
 * its OAuth callback on `callbackPort` of loopback (mcp-remote's second argument) and its
 * tokens in a config directory of its own, and connects an SDK stdio client to it (resolves
 * once signed in and initialized). `*.localhost` resolves to loopback in it.
 */
export async function connectMcpRemoteOAuth(url: string, callbackPort: number): Promise<McpRemoteOAuth> {
  const configDir = await mkdtemp(join(tmpdir(), 'mcp-remote-oauth-'))
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [MCP_REMOTE, url, String(callbackPort), '--transport', 'http-only', '--allow-http'],
    env: { ...withoutDesktop(process.env), NODE_OPTIONS: `--import ${RESOLVE_LOCALHOST}`, MCP_REMOTE_CONFIG_DIR: configDir, BROWSER: HEADLESS_BROWSER },
    stderr: 'pipe',
  })
  let stderr = ''
  transport.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString()))
  const client = new Client({ name: 'stdio-host', version: '1.0.0' })
  const close = async () => {
    await client.close()
    await rm(configDir, { recursive: true, force: true })
  }
  try {
    await client.connect(transport)
  } catch (error) {
    await close()
    throw error
  }
  return { client, stderr: () => stderr, close }
}
