/**
 * Preloaded (`node --import`) into MCP clients the tests run as child processes (the MCP
 * Inspector's CLI, mcp-remote): resolves `localhost` and every `*.localhost` name to
 * 127.0.0.1, as browsers and curl do (RFC 6761 section 6.3) and as `nss-myhostname` does on
 * systems that have it. Without it, those clients ask the system resolver, which here answers
 * ENOTFOUND for `weather.localhost` (README, "Quick start"). Every other name goes to the
 * resolver as before. It patches `dns.lookup`, which `net.connect` (and so `node:http` and
 * Node's `fetch`) calls for each connection.
 */
import dns from 'node:dns'
import process from 'node:process'

const systemLookup = dns.lookup

/**
 * `dns.lookup`, answering 127.0.0.1 for `localhost` and `*.localhost`.
 * @param {string} hostname
 * @param {any} options a family, an options object, or the callback
 * @param {any} [callback]
 * @returns {void}
 */
function lookup(hostname, options, callback) {
  if (typeof options === 'function') return lookup(hostname, {}, options)
  const opts = typeof options === 'number' ? { family: options } : (options ?? {})
  const name = String(hostname).toLowerCase().replace(/\.$/, '')
  if (name !== 'localhost' && !name.endsWith('.localhost')) return systemLookup(hostname, options, callback)
  if (opts.all) process.nextTick(callback, null, [{ address: '127.0.0.1', family: 4 }])
  else process.nextTick(callback, null, '127.0.0.1', 4)
}

dns.lookup = /** @type {typeof dns.lookup} */ (lookup)
