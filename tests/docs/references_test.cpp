// Every citation in the repository can be followed inside it. The code, tests and docs cite the two source
// documents by their own numbering ("seed 000 §5.7", "Table 8", "Figures 20-22", "eq. 10", "Appendix F",
// seed 002's "limitation 4" and its sections by name, as in: seed 002, "Weight Loading") and the design by
// "contract N". Each cited item must have a heading in docs/references.md (a contract: in docs/design.md)
// that names it the same way, e.g. "## Seed 000, Table 8: ...", "### Contract 3: ...". And no file points
// at the design page or the seed files outside the repository.
//
// Scanned: every .cpp, .hpp, .h, .md, .cmake, .py and CMakeLists.txt under the source root, except hidden
// folders, build folders, node_modules and data/.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

const fs::path kRoot = fs::path(EXPAR_TESTS_DIR).parent_path();

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool scanned_file(const fs::path& p) {
  static const std::set<std::string> kExtensions = {".cpp", ".hpp", ".h", ".md", ".cmake", ".py"};
  return p.filename() == "CMakeLists.txt" || kExtensions.count(p.extension().string()) > 0;
}

bool skipped_dir(const std::string& name) {
  return name.starts_with(".") || name.starts_with("build") || name == "node_modules" || name == "data";
}

std::vector<fs::path> repository_files() {
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(kRoot); it != fs::recursive_directory_iterator(); ++it) {
    if (it->is_directory()) {
      if (skipped_dir(it->path().filename().string())) it.disable_recursion_pending();
    } else if (it->is_regular_file() && scanned_file(it->path())) {
      files.push_back(it->path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

bool word_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
}

// A list of numbers after a word: "8", "8 and 9", "15/16", "20-22" or "14–16" (a range: every number in it).
std::vector<int> number_list(const std::string& first, const std::string& tail) {
  std::vector<int> out{std::stoi(first)};
  static const std::regex kItem(R"(\s?(,|/|and|-|–)\s?(\d+))");
  for (std::sregex_iterator it(tail.begin(), tail.end(), kItem), end; it != end; ++it) {
    const int n = std::stoi((*it)[2].str());
    if ((*it)[1] == "-" || (*it)[1] == "–") {
      for (int k = out.back() + 1; k <= n; ++k) out.push_back(k);
    } else {
      out.push_back(n);
    }
  }
  return out;
}

// The citation keys of one text, e.g. "Table 8", "Figure 21", "Equation 10", "§5.7", "Appendix F",
// "limitation 4", "\"Weight Loading\"", "Seed 002" (references.md) and "Contract 3" (design.md). A rule is
// tried at each occurrence of its anchor that starts a word, on the next characters only.
struct Rule {
  std::vector<std::string> anchors;
  std::regex pattern;  // matched from the anchor on
  std::function<void(const std::cmatch&, std::set<std::string>&)> keys;
};

const std::vector<Rule>& rules() {
  static const std::string kNumbers = R"((\d+)((?:\s?(?:,|/|and|-|–)\s?\d+)*))";
  auto numbered = [](std::string name) {
    return [name](const std::cmatch& m, std::set<std::string>& out) {
      for (int n : number_list(m[1].str(), m[2].str())) out.insert(name + " " + std::to_string(n));
    };
  };
  static const std::vector<Rule> kRules = {
      {{"Table"}, std::regex("Tables? " + kNumbers), numbered("Table")},
      {{"Figure"}, std::regex("Figures? " + kNumbers), numbered("Figure")},
      {{"eq.", "Eq.", "equation", "Equation"},
       std::regex(R"((?:[Ee]q\.\s?|[Ee]quations?\s))" + kNumbers),
       numbered("Equation")},
      {{"contract", "Contract"}, std::regex("[Cc]ontracts? " + kNumbers), numbered("Contract")},
      {{"limitation"}, std::regex("limitations? " + kNumbers), numbered("limitation")},
      {{"§"},
       std::regex(R"(§\s?(\d+(?:\.\d+)*)(?:\s?(?:-|–)\s?(\d+(?:\.\d+)*))?)"),
       [](const std::cmatch& m, std::set<std::string>& out) {
         for (int g = 1; g <= 2; ++g) {
           if (m[g].matched) out.insert("§" + m[g].str());
         }
       }},
      {{"Appendix"},
       std::regex(R"(Appendix ([A-Z])\b)"),
       [](const std::cmatch& m, std::set<std::string>& out) { out.insert("Appendix " + m[1].str()); }},
      {{"seed 00", "Seed 00"},
       std::regex(R"([Ss]eed (00\d)(?:,? ("[^"\n]+"))?)"),
       [](const std::cmatch& m, std::set<std::string>& out) {
         out.insert("Seed " + m[1].str());
         if (m[2].matched && m[1] == "002") out.insert(m[2].str());
       }},
  };
  return kRules;
}

std::set<std::string> citation_keys(const std::string& text) {
  std::set<std::string> keys;
  for (const Rule& rule : rules()) {
    for (const std::string& anchor : rule.anchors) {
      for (size_t pos = text.find(anchor); pos != std::string::npos; pos = text.find(anchor, pos + 1)) {
        if (pos > 0 && word_char(text[pos - 1])) continue;
        const char* begin = text.data() + pos;
        const char* end = text.data() + std::min(text.size(), pos + 200);
        std::cmatch m;
        if (std::regex_search(begin, end, m, rule.pattern, std::regex_constants::match_continuous)) {
          rule.keys(m, keys);
        }
      }
    }
  }
  return keys;
}

// The headings of a markdown page (lines that start with '#').
std::vector<std::string> headings(const std::string& page) {
  std::vector<std::string> out;
  std::istringstream in(page);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("#")) out.push_back(line);
  }
  return out;
}

// Whether a heading names `key` itself: "Table 8" is not "Table 80", "§5.1" is not "§5.10" or "§5.1.2".
bool names(const std::string& heading, const std::string& key) {
  for (size_t pos = heading.find(key); pos != std::string::npos; pos = heading.find(key, pos + 1)) {
    const size_t after = pos + key.size();
    if (after == heading.size()) return true;
    const char next = heading[after];
    const bool more_number = std::isdigit(static_cast<unsigned char>(next)) != 0 ||
                             (next == '.' && after + 1 < heading.size() &&
                              std::isdigit(static_cast<unsigned char>(heading[after + 1])));
    if (!more_number) return true;
  }
  return false;
}

bool has_entry(const std::vector<std::string>& page_headings, const std::string& key) {
  return std::any_of(page_headings.begin(), page_headings.end(),
                     [&](const std::string& h) { return names(h, key); });
}

TEST(References, CitationKeysAreReadAsWritten) {
  EXPECT_EQ(citation_keys("seed 000 §5.4-5.7, Table 8"),
            (std::set<std::string>{"Seed 000", "§5.4", "§5.7", "Table 8"}));
  EXPECT_EQ(citation_keys("Figures 20-22 and Figure 15/16"),
            (std::set<std::string>{"Figure 20", "Figure 21", "Figure 22", "Figure 15", "Figure 16"}));
  EXPECT_EQ(citation_keys("equations 8 and 9; eq.10; contracts 3 and 4"),
            (std::set<std::string>{"Equation 8", "Equation 9", "Equation 10", "Contract 3", "Contract 4"}));
  EXPECT_EQ(citation_keys(R"((seed 002, "Weight Loading"), seed 002 limitation 2, Appendix F)"),
            (std::set<std::string>{"Seed 002", "\"Weight Loading\"", "limitation 2", "Appendix F"}));
  EXPECT_EQ(citation_keys("a timetable 8, subsection 5, frequency 3"), std::set<std::string>{});
}

TEST(References, AHeadingNamesExactlyItsItem) {
  const std::vector<std::string> page = {"# References", "## Seed 000, Table 8: adjoint movements",
                                         "## Seed 000 §5.1: ranks", "### Seed 002, limitation 4: placement"};
  EXPECT_TRUE(has_entry(page, "Table 8"));
  EXPECT_TRUE(has_entry(page, "§5.1"));
  EXPECT_TRUE(has_entry(page, "limitation 4"));
  EXPECT_FALSE(has_entry(page, "Table 80"));
  EXPECT_FALSE(has_entry(page, "Table 6"));
  EXPECT_FALSE(has_entry({"## Seed 000 §5.10: x"}, "§5.1"));
  EXPECT_FALSE(has_entry({"## Seed 000 §5.1.2: x"}, "§5.1"));
  EXPECT_FALSE(has_entry(headings("Table 8 in a line that is not a heading\n"), "Table 8"));
}

TEST(References, EveryCitationHasAnEntry) {
  const std::vector<std::string> references = headings(read_text(kRoot / "docs" / "references.md"));
  const std::vector<std::string> design = headings(read_text(kRoot / "docs" / "design.md"));
  ASSERT_FALSE(references.empty()) << "docs/references.md is missing or has no headings";
  ASSERT_FALSE(design.empty()) << "docs/design.md is missing or has no headings";

  std::map<std::string, std::set<std::string>> cited_in;  // key -> files
  const std::vector<fs::path> files = repository_files();
  for (const fs::path& file : files) {
    const std::string name = fs::relative(file, kRoot).generic_string();
    if (name == "tests/docs/references_test.cpp") continue;  // its examples are not citations
    for (const std::string& key : citation_keys(read_text(file))) cited_in[key].insert(name);
  }
  // The scan itself must see the repository: these are cited in several files.
  EXPECT_GT(files.size(), 200u) << "scanned under " << kRoot;
  for (const char* known : {"Table 8", "§5.7", "Equation 10", "Contract 3", "\"Weight Loading\""}) {
    EXPECT_TRUE(cited_in.count(known)) << known << " is cited in the repository but the scan did not find it";
  }

  for (const auto& [key, where] : cited_in) {
    const bool contract = key.starts_with("Contract ");
    const char* page = contract ? "docs/design.md" : "docs/references.md";
    if (has_entry(contract ? design : references, key)) continue;
    std::string files_list;
    for (const std::string& f : where) files_list += "\n  " + f;
    ADD_FAILURE() << key << " is cited but no heading of " << page << " names it (add an entry whose heading "
                  << "contains " << key << ", saying what it states); cited in:" << files_list;
  }
}

TEST(References, NothingPointsOutsideTheRepository) {
  // Built from parts so that this file does not match itself.
  const std::vector<std::string> outside = {std::string("../") + "shared/", std::string("seeds") + "/00"};
  for (const fs::path& file : repository_files()) {
    const std::string text = read_text(file);
    for (const std::string& s : outside) {
      EXPECT_EQ(text.find(s), std::string::npos)
          << fs::relative(file, kRoot).string() << " points outside the repository (" << s
          << "): cite docs/design.md or docs/references.md instead";
    }
  }
}

}  // namespace
