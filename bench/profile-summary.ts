/**
 * Prints the top self-time functions of a V8 `.cpuprofile`:
 * `node --import tsx bench/profile-summary.ts <file.cpuprofile> [top]`.
 */
import { readFileSync } from 'node:fs'

interface ProfileNode {
  id: number
  callFrame: { functionName: string; url: string; lineNumber: number }
  hitCount?: number
}
const [file, topArg, ...rest] = process.argv.slice(2)
const count = Number(topArg ?? 25)
// One profile at a time: a glob matching two would make the second the count.
if (!file || rest.length > 0 || !Number.isInteger(count) || count < 1) {
  throw new Error(`usage: profile-summary.ts <file.cpuprofile> [top] (one file, top a positive integer; got ${JSON.stringify(process.argv.slice(2))})`)
}
const profile = JSON.parse(readFileSync(file, 'utf8')) as { nodes: ProfileNode[]; samples: number[] }
const total = profile.samples.length
const self = new Map<string, number>()
for (const node of profile.nodes) {
  const { functionName, url, lineNumber } = node.callFrame
  const where = url ? `${url.replace(/^.*\/(node_modules|src|bench)\//, '$1/')}:${lineNumber + 1}` : ''
  const key = `${functionName || '(anonymous)'} ${where}`.trim()
  self.set(key, (self.get(key) ?? 0) + (node.hitCount ?? 0))
}
const top = [...self.entries()].sort((a, b) => b[1] - a[1]).slice(0, count)
for (const [key, hits] of top) console.log(`${((hits / total) * 100).toFixed(1).padStart(5)}%  ${key}`)
