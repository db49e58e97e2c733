// Lint: type-aware rules that catch what strict tsc does not — promises nobody awaits,
// import cycles, imports that reach around a folder's index.ts.
import js from "@eslint/js";
import tseslint from "typescript-eslint";
import importX from "eslint-plugin-import-x";

export default tseslint.config(
  { ignores: ["node_modules/**", "dist/**", "examples/**", "protocol/schema/**", "bin/**", "eslint.config.js", "vitest.config.ts", "vitest.faults.config.ts"] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ["**/*.ts"],
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    plugins: { "import-x": importX },
    rules: {
      "@typescript-eslint/no-floating-promises": "error",
      "@typescript-eslint/no-misused-promises": ["error", { checksVoidReturn: false }],
      "@typescript-eslint/no-explicit-any": "error",
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
      "no-empty": ["error", { allowEmptyCatch: true }],
      "import-x/no-cycle": "error",
      // Folders talk through their front door (index.ts); tests and benchmarks may look inside.
      "no-restricted-imports": ["error", { patterns: [{ regex: "^\\.\\./(?:\\.\\./)*(cluster|ops|protocol|common)/(?!index\\.ts$)[^/]+", message: "import the folder's index.ts" }] }],
    },
  },
  { files: ["test/**", "bench/**", "scripts/**"], rules: { "no-restricted-imports": "off" } },
);
