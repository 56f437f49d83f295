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
    },
  },
)
