// Types of dag.js, the shared DAG renderer, for the VS Code webview's TypeScript (checked by
// `tsc` in editors/vscode). The layout is rsim's `faces::dagview::DagLayout` as JSON.

export interface DagNode {
  id: string;
  title: string;
  status: string;
  outcome?: string | null;
  verdict?: string | null;
  score?: number | null;
  evals: number;
  /** A dev score significantly above the hidden dev twin's: drawn marked, never ranked. */
  suspect?: boolean;
  x: number;
  y: number;
  collapsed: number;
  expand?: string | null;
  best: boolean;
}

export interface DagLayout {
  total: number;
  shown: number;
  summarised: boolean;
  task?: string | null;
  metric?: string | null;
  best?: string | null;
  best_path: string[];
  frontier: string[];
  width: number;
  height: number;
  nodes: DagNode[];
  edges: [number, number][];
  /** Present only when the study cannot be written here (a clone without its private key): why. */
  read_only?: string | null;
}

export interface DagView {
  /** Draw a layout (again: keeps the reader's pan and zoom once they moved). */
  update(layout: DagLayout): void;
  /** Highlight a node (null: none); whether it is drawn. */
  select(id: string | null): boolean;
  /** Zoom to show the whole DAG. */
  fit(): void;
  destroy(): void;
}

export function cleanText(s: unknown): string;
/** null when the layout's study is writable; else the "read-only clone" marker and its reason. */
export function readOnlyNote(layout: Pick<DagLayout, "read_only"> | null | undefined): { text: string; title: string } | null;
export function nodeColor(n: Pick<DagNode, "verdict" | "status">): string;
export function mountDag(
  element: HTMLElement,
  opts?: {
    onSelect?: (id: string, node: DagNode) => void;
    onExpand?: ((id: string, node: DagNode) => void) | null;
  },
): DagView;
