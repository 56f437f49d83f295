/**
 * Profiles the core decision: `node --cpu-prof --cpu-prof-dir=bench/results/profiles --import tsx bench/profile-decision.ts`
 * then open the .cpuprofile in Chrome DevTools (Performance) or summarize it with
 * `node --import tsx bench/profile-summary.ts <file>`.
 */
import { benchRequest, createBenchFixture } from './fixture.js'

const seconds = Number(process.argv[2] ?? 3)
const fixture = await createBenchFixture({ store: 'memory' })
const request = benchRequest(fixture)
const end = Date.now() + seconds * 1000
let n = 0
while (Date.now() < end) {
  for (let i = 0; i < 10_000; i++) await fixture.dispatcher.decide(request)
  n += 10_000
}
console.log(`${n} decisions in ${seconds} s: ${Math.round(n / seconds).toLocaleString('en-US')}/s (profiling overhead included)`)
await fixture.close()
