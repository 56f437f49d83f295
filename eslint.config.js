import js from '@eslint/js'
import tseslint from 'typescript-eslint'

export default tseslint.config(
  {
    ignores: ['dist/**', 'node_modules/**', 'test/conformance/node_modules/**', 'test/runtimes/node_modules/**', 'test/nextjs/node_modules/**', 'test/node24/node_modules/**', 'test/nextjs/.next/**', 'test/nextjs/next-env.d.ts', 'bench/results/**', 'coverage/**', '.scratch/**'],
  },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      '@typescript-eslint/no-explicit-any': 'off',
      // Node 20's URL.canParse, once V8 optimises it, answers false for strings with Latin-1
      // characters (`https://é`) that new URL parses: the same value accepted, then refused.
      'no-restricted-properties': ['error', { object: 'URL', property: 'canParse', message: 'Node 20 answers false for Latin-1 strings once optimised: use parseUrl (src/core/url.ts, examples/shared/url.ts).' }],
    },
  },
)
