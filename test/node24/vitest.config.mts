/**
 * `npm run test:node24`: the root configuration, run from the project root, less three files
 * the second leg of `.ci/run` leaves out because Node does not change what they check (the
 * docs samples' type check, the examples started as processes, the OAuth cache shared through
 * Redis). The files it runs are named on the command line (package.json). They are left out
 * here rather than with `--exclude`, which vitest applies to the root project alone, not to the
 * projects the root configuration declares.
 */
import { fileURLToPath } from 'node:url'
import { mergeConfig } from 'vitest/config'
import base from '../../vitest.config.js'

export default mergeConfig(base, {
  root: fileURLToPath(new URL('../..', import.meta.url)),
  test: {
    exclude: ['test/package/docs-samples-typecheck.test.ts', 'test/adapters/examples.test.ts', 'test/oauth/shared-cache-audit.test.ts'],
  },
})
